"""Drafter sizes and training cost: parameters, and forward + loss + backward time per 1k tokens.

    python benchmarks/bench_models.py --batch 2 --seq-len 256 --iters 3

Shapes: SmolLM2-135M (d=576, V=49152; Falcon layers with 9 heads / 3 kv heads / head_dim 64 /
intermediate 1536) for the timings, Vicuna-7B (d=4096, V=32000, 32 heads, intermediate 11008)
for the parameter counts only (built on the meta device). Inputs are random features with a
random frozen LM head and embedding of the target's shape; the loss is the drafter's training
loss (heads_loss, or csgd_step for Falcon). Parameter counts are trainable drafter parameters
(the target's head and embedding are not counted) and are checked against `num_params(cfg)`.
Prints a markdown table.
"""

import argparse
import statistics
import time

import torch
from torch import nn

from drafters.losses import csgd_step, heads_loss
from drafters.models import (
    CerberusConfig,
    CerberusHeads,
    FalconConfig,
    FalconDrafter,
    LearnedGate,
    LearnedGateConfig,
    MedusaConfig,
    MedusaHeads,
    entropy,
)

SHAPES = {
    "smollm2": dict(d=576, V=49152, heads=9, kv=3, head_dim=64, inter=1536, theta=100000.0),
    "vicuna7b": dict(d=4096, V=32000, heads=32, kv=32, head_dim=128, inter=11008, theta=10000.0),
}


def drafters(s: dict) -> dict:
    """name -> (configs, builder, how the loss is computed)."""
    d, V = s["d"], s["V"]
    falcon = dict(
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv"],
        head_dim=s["head_dim"],
        intermediate_size=s["inter"],
        rope_theta=s["theta"],
    )
    return {
        "Medusa (K=4, L=1)": ([MedusaConfig(d, V, 4, 1)], "heads"),
        "Cerberus (K=4, L=2)": ([CerberusConfig(d, V, 4, 2)], "heads"),
        "Cerberus (K=4, L=2) + learned gate": (
            [CerberusConfig(d, V, 4, 2), LearnedGateConfig(d, 4, 256)],
            "heads+gate",
        ),
        "Cerberus (K=4, L=2, learned residual)": ([CerberusConfig(d, V, 4, 2, True)], "heads"),
        "Falcon (k=2, linear), teacher forcing": ([FalconConfig(d, V, 2, **falcon)], "tf"),
        "Falcon (k=2, LSTM), teacher forcing": (
            [FalconConfig(d, V, 2, fusion="lstm", **falcon)],
            "tf",
        ),
        "Falcon (k=2, linear), CSGD as decoded (TF + own-block pass)": (
            [FalconConfig(d, V, 2, **falcon)],
            "csgd",
        ),
        "Falcon (k=2, linear), CSGD paper (2 passes)": (
            [FalconConfig(d, V, 2, **falcon)],
            "csgd-paper",
        ),
    }


def build(cfg) -> nn.Module:
    return {
        MedusaConfig: MedusaHeads,
        CerberusConfig: CerberusHeads,
        FalconConfig: FalconDrafter,
        LearnedGateConfig: LearnedGate,
    }[type(cfg)](cfg)


def count(cfgs, device="cpu") -> int:
    with torch.device(device):
        n = sum(p.numel() for cfg in cfgs for p in build(cfg).parameters())
    assert n == sum(cfg.num_params() for cfg in cfgs), "parameter formula mismatch"
    return n


def time_step(cfgs, mode: str, s: dict, B: int, T: int, iters: int) -> float:
    torch.manual_seed(0)
    d, V = s["d"], s["V"]
    lm = nn.Linear(d, V, bias=False).requires_grad_(False)
    embed = nn.Embedding(V, d).requires_grad_(False)
    f = torch.randn(B, T, d)
    ids = torch.randint(0, V, (B, T))
    attn = torch.ones(B, T, dtype=torch.long)
    loss_mask = torch.ones(B, T)
    loss_mask[:, :16] = 0  # a short prompt
    modules = [build(cfg) for cfg in cfgs]
    h = entropy(lm(f)).detach() if mode == "heads+gate" else None  # target-side, not timed
    g = torch.Generator().manual_seed(0)

    def step():
        if mode.startswith("heads"):
            gate = modules[1](f, target_entropy=h) if mode == "heads+gate" else None
            loss, _ = heads_loss(modules[0](f, lm), ids, loss_mask, gate_logits=gate)
        else:
            loss, _ = csgd_step(
                modules[0],
                f,
                ids,
                attn,
                loss_mask,
                embed,
                lm,
                k=2,
                lam=0.4,
                teacher_forcing_only=mode == "tf",
                variant="paper" if mode == "csgd-paper" else "decode",
                generator=g,
                noise=0.1,
            )
        loss.backward()
        for m in modules:
            m.zero_grad(set_to_none=True)

    step()  # warm-up
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000 / (B * T) * 1000  # ms per 1k tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    small, big = drafters(SHAPES["smollm2"]), drafters(SHAPES["vicuna7b"])
    rows = []
    for name, (cfgs, mode) in small.items():
        ms = time_step(cfgs, mode, SHAPES["smollm2"], args.batch, args.seq_len, args.iters)
        rows.append((name, count(cfgs), count(big[name][0], "meta"), ms))
        print(f"{name}: {ms:.0f} ms / 1k tokens", flush=True)

    print(
        f"\nfp32, CPU, {torch.get_num_threads()} threads, batch {args.batch} x {args.seq_len} "
        f"tokens, median of {args.iters}; time = forward + loss + backward at SmolLM2 shape\n"
    )
    print("| drafter | params (SmolLM2) | params (Vicuna-7B) | fwd+bwd ms / 1k tokens |")
    print("|---|---:|---:|---:|")
    for name, n_small, n_big, ms in rows:
        print(f"| {name} | {n_small:,} | {n_big:,} | {ms:.0f} |")


if __name__ == "__main__":
    main()
