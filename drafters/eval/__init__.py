"""Evaluation: what a drafter is worth on this machine.

bench.py    Spec-Bench style benchmark: every method on the same prompts, speedup and lossless
records.py  the benchmark's resumable, shardable records
report.py   tables and figures from the records
tune.py     the decoder's knobs (tree size, the HF peers' settings) on held-out ShareGPT
prompts/    the evaluation prompt sets (MT-Bench, Spec-Bench), shipped as package data
"""
