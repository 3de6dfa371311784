"""The benchmark's methods: what `drafters-bench` (and `drafters-tune`, the zoo's check) times on
each prompt. A `Method` generates greedily from token ids; its `info` is what the run records of
it. Built-ins: HF `generate` (plain, prompt lookup, early exit), the in-house AR loop and n-gram
verifier; and per exported drafter one method per gate (`build_methods`, the --drafter and
--gates syntax of drafters/eval/bench.py's docstring)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

BUILTIN_METHODS = ("hf_greedy", "ar", "hf_prompt_lookup", "hf_early_exit", "ngram")
GATE_CHOICES = ("none", "default", "entropy", "learned", "budget", "hybrid", "budget+entropy",
                "budget+learned", "hybrid+entropy", "hybrid+learned")  # fmt: skip
FIXED_SIZE = re.compile(r"(dynamic|hybrid)(\d+)")  # a dynamic tree of n nodes a step


@dataclass
class Method:
    name: str
    kind: str  # "hf" | "ar" | a drafter kind
    generate: Callable[[torch.Tensor, int], tuple[list[int], dict]]  # ids (1, T), n -> out
    info: dict = field(default_factory=dict)
    before: Callable[[torch.Tensor], dict] | None = None  # untimed per-turn set-up


# The assistant's own settings. With `assistant_early_exit` the assistant is the target itself and
# HF reads these from `model.generation_config`, not from generate()'s keyword arguments (checked
# on transformers 5.24: passed to generate(), the early-exit drafter still drafts 20 tokens with
# threshold 0.4), so hf_method sets them on the model's config for the call.
ASSISTANT_KEYS = ("num_assistant_tokens", "assistant_confidence_threshold",
                  "num_assistant_tokens_schedule")  # fmt: skip


def hf_method(target, name: str, **generate_kwargs) -> Method:
    """HF `generate(do_sample=False)` with `generate_kwargs` (prompt lookup, early exit, ...)."""
    kwargs = dict(generate_kwargs)
    assistant = {}
    if kwargs.get("assistant_early_exit") is not None:
        assistant = {k: kwargs.pop(k) for k in ASSISTANT_KEYS if k in kwargs}

    def generate(ids: torch.Tensor, n: int) -> tuple[list[int], dict]:
        config = target.model.generation_config
        saved = {k: getattr(config, k, None) for k in assistant}
        for k, v in assistant.items():
            setattr(config, k, v)
        try:
            out = target.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=n,
                pad_token_id=target.tokenizer.pad_token_id,
                **kwargs,
            )
        finally:
            for k, v in saved.items():
                setattr(config, k, v)
        return out[0, ids.shape[1] :].tolist(), {}

    return Method(name, "hf", generate, dict(generate_kwargs))


def ngram_method(target) -> Method:
    """n-gram candidates only (prompt lookup) through the in-house verifier, sized per step by
    cost like the budget gate (`drafters.decoding.dynamic`)."""
    from drafters.decoding.cost import cost_profile
    from drafters.decoding.dynamic import DynamicConfig, decode_dynamic

    cfg = DynamicConfig()

    def before(ids: torch.Tensor) -> dict:
        cost_profile(target, cfg.max_nodes + 1)  # measured once, untimed
        return {}

    def generate(ids: torch.Tensor, n: int) -> tuple[list[int], dict]:
        res = decode_dynamic(target, None, ids, n, cfg)
        return res.output_ids.tolist(), _decode_stats(res)

    return Method("ngram", "ngram", generate, {"max_nodes": cfg.max_nodes}, before)


def ar_method(target) -> Method:
    from drafters.decoding import decode_ar

    def generate(ids: torch.Tensor, n: int) -> tuple[list[int], dict]:
        res = decode_ar(target, ids, n)
        return res.output_ids.tolist(), _decode_stats(res)

    return Method("ar", "ar", generate)


def drafter_method(target, drafter, gate: str | None, name: str, tree=None, dynamic=None) -> Method:
    """tree: None (the exported one) or a list of paths overriding it (e.g. tuning sweeps);
    dynamic: the `DynamicConfig` of a budget or hybrid gate (None: its defaults)."""
    from drafters.speculate import BUDGET_GATES, cost_ratio, dynamic_config, speculative_decode

    state: dict = {}
    phase_k = drafter.model.cfg.k if drafter.kind == "falcon" else None  # tau by N mod k

    def before(ids: torch.Tensor) -> dict:
        if gate is None:
            return {}
        if gate in BUDGET_GATES:  # the step cost profile, measured once per run, untimed
            from drafters.decoding.cost import cost_profile

            cfg = dynamic_config(gate, dynamic)
            if cfg.budget is None:  # a fixed budget reads no cost
                cost_profile(target, cfg.max_nodes + 1)
            return {}
        state["cost_ratio"] = cost_ratio(target, drafter, ids.shape[1])
        return {"cost_ratio": state["cost_ratio"]}

    def generate(ids: torch.Tensor, n: int) -> tuple[list[int], dict]:
        res = speculative_decode(
            target, drafter, ids, n, gate=gate or "none", tree=tree,
            cost_ratio=state.get("cost_ratio"), dynamic=dynamic,
        )  # fmt: skip
        return res.output_ids.tolist(), _decode_stats(res, phase_k)

    used = drafter.tree if tree is None else tree
    named = tree if isinstance(tree, str) else "given"  # a preset / chain<K>, or paths
    info = {
        "drafter": str(drafter.folder),
        "gate": gate,
        "tree": drafter.config["tree"]["name"] if tree is None else named,
        "tree_nodes": None if isinstance(used, str) or not hasattr(used, "__len__") else len(used),
        "num_params": drafter.config["weights"]["num_params"],
    }
    if dynamic is not None:  # as decoded (dynamic<n>: no n-gram candidates)
        info["dynamic"] = asdict(dynamic_config(gate, dynamic))
    return Method(name, drafter.kind, generate, info, before)


def _decode_stats(res, phase_k: int | None = None) -> dict:
    """A turn's record of a decode: `res.stats()` less the wall time, `accept_hist` (verification
    forwards per accepted length 0, 1, ...) and, with phase_k (Falcon's k; None for head
    drafters and AR, whose drafting does not depend on N mod k), `tau_by_phase`: the raw counts
    of `DecodeResult.tau_by_phase`, {"r": {"steps": .., "tokens": ..}} for r = 0 .. k-1, which
    the report pools into tau per phase."""
    s = res.stats()
    hist = Counter(res.accept_lens)
    s["accept_hist"] = [hist.get(a, 0) for a in range(max(hist, default=-1) + 1)]
    nodes = Counter(res.step_nodes)  # draft nodes verified per step (0: an AR step)
    s["nodes_hist"] = [nodes.get(n, 0) for n in range(max(nodes, default=-1) + 1)]
    s.pop("wall_time_s")
    if phase_k is not None:
        phases = res.tau_by_phase(phase_k)
        s["tau_by_phase"] = {
            str(r): {"steps": p["steps"], "tokens": p["tokens"]} for r, p in phases.items()
        }
    return s


def fixed_size_gate(name: str):
    """ "dynamic<n>" / "hybrid<n>": the dynamic tree (without / with n-gram candidates) verifying
    its n best candidates every step, as (gate, DynamicConfig); None for any other name."""
    m = FIXED_SIZE.fullmatch(name)
    if m is None:
        return None
    from drafters.decoding.dynamic import DynamicConfig

    return ("budget" if m[1] == "dynamic" else "hybrid"), DynamicConfig.fixed(int(m[2]))


def split_drafter_spec(spec: str) -> tuple[str, list[str] | None]:
    """ "FOLDER" or "FOLDER@GATE[,GATE..]" (that drafter's own --gates list; besides
    GATE_CHOICES, dynamic<n> and hybrid<n> for a dynamic tree of n nodes a step)."""
    folder, sep, gates = spec.rpartition("@")
    if not sep:
        return spec, None
    names = gates.split(",")
    bad = [g for g in names if g not in GATE_CHOICES and not FIXED_SIZE.fullmatch(g)]
    if bad:
        raise ValueError(f"--drafter {spec!r}: unknown gate {bad[0]!r}; use one of "
                         f"{GATE_CHOICES}, dynamic<n> or hybrid<n> (n nodes a step)")  # fmt: skip
    return folder, names


def build_methods(args, target) -> list[Method]:
    from drafters.export import load_drafter
    from drafters.speculate import BUDGET_GATES

    methods: list[Method] = []
    for name in args.methods:
        if name == "hf_greedy":
            methods.append(hf_method(target, name))
        elif name == "ar":
            methods.append(ar_method(target))
        elif name == "ngram":
            methods.append(ngram_method(target))
        elif name == "hf_prompt_lookup":
            methods.append(hf_method(target, name, prompt_lookup_num_tokens=args.prompt_lookup))
        elif name == "hf_early_exit":
            layer = args.early_exit_layer or max(1, target.config.num_hidden_layers // 5)
            extra = {"num_assistant_tokens": args.early_exit_tokens,
                     "assistant_confidence_threshold": args.early_exit_threshold}  # fmt: skip
            extra = {k: v for k, v in extra.items() if v is not None}
            methods.append(hf_method(target, name, assistant_early_exit=layer, **extra))
    taken = {m.name for m in methods}
    for spec in args.drafter:
        folder, own_gates = split_drafter_spec(spec)
        drafter = load_drafter(folder, target)  # refuses a drafter of another target
        base = drafter.name
        i = 2
        while base in taken:
            base, i = f"{drafter.name}_{i}", i + 1
        gates: list[str | None] = []
        for g in own_gates or args.gates:
            g = (drafter.config["gate"]["default"] if g == "default" else g) or "none"
            # dynamic trees, any kind
            budget = g in ("budget", "hybrid") or FIXED_SIZE.fullmatch(g) is not None
            own = g.partition("+")[2] if "+" in g else g  # the drafter's gate it needs, if any
            if (
                g != "none"
                and not budget
                and (drafter.kind == "falcon" or own not in drafter.gates)
            ):
                continue  # no such gate on this drafter
            gates.append(None if g == "none" else g)
        for g in dict.fromkeys(gates):
            name = base if g is None else f"{base}+{g}"
            taken.add(name)
            gate, dynamic = fixed_size_gate(g or "") or (g, None)
            tree = None if gate in BUDGET_GATES else args.tree  # --tree (None: exported)
            methods.append(drafter_method(target, drafter, gate, name, tree, dynamic))
    if not methods:
        raise ValueError("no method to run: give --methods and/or --drafter")
    return methods
