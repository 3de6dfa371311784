"""Tune what the decoder exposes, on held-out ShareGPT data (never on the evaluation sets).

    drafters-tune --drafter outputs/results/drafters/falcon_k2 --out outputs/results/tune
    drafters-tune --peers --out outputs/results/tune        # HF peers' knobs

Per drafter:
1. Top-k accuracy per depth on the held-out conversations of the distilled corpus (the training
   runs' validation split, from the offline feature cache): heads, P(head i's rank-r token is
   right); Falcon, P(the rank-r token at depth d is right | the top-1 drafts above it are right)
   measured as decoded (`losses/own_blocks.py`): depths 1..k from the teacher-forced pass at
   blocks aligned on the root, depths k+1..2k from an own-block pass reading the drafter's own
   pairs over true context; deeper passes repeat the second one's rows. (LSTM fusion: depths
   1..k only, repeated for every pass.)
2. Candidate trees: the greedy best tree of each size in --sizes from those accuracies
   (`build_tree`, `build_falcon_tree` with one anchor per pass), each size first moved to just
   below a step of the target forward's cost by rows, measured here (`forward_cost_profile`,
   `snap_sizes`; --no-snap keeps the sizes as given).
3. Speed sweep on the first user turns of ShareGPT's validation split (by conversation id, never
   distilled or trained on): every candidate and the in-house AR loop, prompt after prompt, with
   --max-new-tokens each; tokens/s pooled over prompts. Every candidate's output must equal the AR
   loop's (lossless), else the sweep stops.
The fastest candidate is chosen: <out>/<name>.json holds the accuracies, the sweep and the choice;
<out>/<name>.tree.json is the `drafters-export --tree` input that rebuilds the chosen tree.
4. The dynamic tree in the same sweep (--no-dynamic: left out): `dynamic<n>` verifies the n best
   candidates by the drafter's own confidence every step, for n = each static tree's node count,
   so τ compares the two at equal verify cost; `budget` sizes the tree per step by the measured
   step cost (`drafters-generate --gate budget`). <name>.json's `fastest` names the fastest
   method of all; the export keeps a static tree.
The gates need no tuning here: they speculate iff E[a] > c_tree / c_ar - 1 with the cost ratio
measured on the running machine before each turn, and the entropy gate's E[a] table is fitted on
the same held-out conversations at the end of training.

--peers sweeps HF prompt lookup (`prompt_lookup_num_tokens`) and HF early exit
(`assistant_early_exit` layer x `num_assistant_tokens`, the draft length, HF's default 20 x
`assistant_confidence_threshold`, where the draft stops early, HF's default 0.4) the
same way and writes <out>/peers.json with the fastest of each.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

# ---- held-out accuracies ------------------------------------------------------------------------


def heldout_batches(
    target, dataset_dir: str, cache_dir: str, max_length: int, val_fraction: float, aux_layers=None
):
    """Batches of the distilled corpus's held-out conversations (the training runs' validation
    split), with their cached target features; with aux_layers (an EAGLE-3 drafter's fused
    target layers, `drafters.models.aux_layers_of`) those layers' hidden states too, as the
    drafter reads them."""
    from drafters.training.datamodule import DistilledDataModule

    dm = DistilledDataModule(
        dataset_dir, max_length=max_length, batch_size=4, val_fraction=val_fraction,
        features="offline", cache_dir=cache_dir, aux_layers=aux_layers,
    ).attach(target)  # fmt: skip
    dm.setup()
    return list(dm.val_dataloader())


def _rank_of(logits: torch.Tensor, labels: torch.Tensor, vocab=None) -> torch.Tensor:
    """Rank of each label in its logits row (0 = argmax); logits (..., V or V_d), labels (...)
    target ids. With a draft vocabulary a label outside it gets rank V_d (never drafted)."""
    col = labels if vocab is None else vocab.to_draft(labels)
    picked = logits.gather(-1, col.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    rank = (logits > picked.unsqueeze(-1)).sum(-1)
    return rank.masked_fill(col < 0, logits.shape[-1])


def _ranks_at(pred, rows, labels, head, vocab, topk: int):
    """(ranks, drafts) (B, T): the label's rank in head(pred) and the top-1 draft (target id) at
    `rows`; elsewhere topk (never counted) and -1."""
    from drafters.models.vocab import to_target

    b, j = rows.nonzero(as_tuple=True)
    logits = head(pred[b, j]).float()
    ranks = torch.full_like(labels, topk)
    ranks[b, j] = _rank_of(logits, labels[b, j], vocab)
    drafts = torch.full_like(labels, -1)
    drafts[b, j] = to_target(vocab, logits.argmax(-1))
    return ranks, drafts


@torch.no_grad()
def falcon_depth_counts(model, target, batch: dict, topk: int):
    """(counts (D, topk), totals (D,)) of one held-out batch, D = 2k (k for LSTM fusion): the
    teacher-forced pass, then (linear fusion) one own-block pass, as decoded."""
    from drafters.losses.csgd import own_pass
    from drafters.losses.falcon import falcon_valid
    from drafters.losses.labels import default_position_ids, shift_left
    from drafters.losses.own_blocks import depth_counts

    k, embed = model.cfg.k, target.embed_tokens
    # true inputs as training reads them: f, or EAGLE-3's fused features from wide ones
    f = model.inputs(batch["features"].to(next(model.parameters()).dtype))
    ids, lmask, attn = batch["input_ids"], batch["loss_mask"], batch["attention_mask"]
    pos, nxt = default_position_ids(attn, ids), shift_left(ids, 1)
    valid, labels = falcon_valid(lmask, k), shift_left(ids, k + 1)
    head = model.scoring_head(target.lm_head)
    decode = model.cfg.fusion != "lstm"
    cache = model.new_cache() if decode else None
    pred = model(f, nxt, embed, attn, pos, cache=cache)
    ranks, drafts = _ranks_at(pred, valid, labels, head, model.vocab, topk)
    per_copy, defined = [ranks], [valid]
    if decode:
        pred2, cand, _, _ = own_pass(model, cache, 2, pred, drafts, valid, f, nxt, embed, attn,
                                     pos, k)  # fmt: skip
        rows = cand & valid
        per_copy.append(_ranks_at(pred2, rows, labels, head, model.vocab, topk)[0])
        defined.append(rows)
    return depth_counts(per_copy, defined, pos, k, topk)


@torch.no_grad()
def topk_accuracy(
    drafter, target, batches: list[dict], topk: int
) -> tuple[list[list[float]], list[int]]:
    """(rows, totals): rows[d][r] = P(rank-r guess right) per head (heads) or per depth given
    the top-1 drafts above it right (Falcon, as decoded: `falcon_depth_counts`), over held-out
    positions whose label is a generated token; totals[d]: the positions behind row d (Falcon:
    the roots whose chain reached depth d, so deep rows of a weak drafter may have none)."""
    from drafters.losses.heads import head_labels

    model = drafter.model.eval()
    dtype = next(model.parameters()).dtype
    counts, totals = None, None
    for b in batches:
        if drafter.kind == "falcon":
            c, t = falcon_depth_counts(model, target, b, topk)
        else:
            f = b["features"].to(dtype)
            logits = model(f, target.lm_head)  # (B, T, K, V)
            labels, valid = head_labels(b["input_ids"], b["loss_mask"], logits.shape[2])
            bi, tt, i = valid.nonzero(as_tuple=True)
            rank = _rank_of(logits[bi, tt, i].float(), labels[bi, tt, i], model.vocab)
            rows = logits.shape[2]
            keep = rank < topk
            c = torch.zeros(rows, topk, dtype=torch.long)
            c.index_put_((i[keep], rank[keep]), torch.ones_like(rank[keep]), accumulate=True)
            t = torch.bincount(i, minlength=rows)
        counts = c if counts is None else counts + c
        totals = t if totals is None else totals + t
    acc = counts.double() / totals.clamp(min=1).unsqueeze(-1).double()
    return acc.tolist(), totals.tolist()


def tree_input(drafter, acc: list[list[float]], num_nodes: int) -> dict:
    """The `drafters-export --tree` JSON that builds this drafter's tree of num_nodes from acc."""
    if drafter.kind == "falcon":
        k = drafter.model.cfg.k
        depth = 3 * k  # three passes at most; the last measured pass's rows repeat deeper
        rows = [acc[d] if d < len(acc) else acc[len(acc) - k + d % k] for d in range(depth)]
        return {"topk_acc": rows, "num_nodes": num_nodes, "max_anchors": 1}
    return {"topk_acc": acc, "num_nodes": num_nodes}


def build(drafter, spec: dict):
    from drafters.decoding.falcon_tree import build_falcon_tree
    from drafters.decoding.tree import build_tree

    if drafter.kind == "falcon":
        k = drafter.model.cfg.k
        return build_falcon_tree(spec["topk_acc"], spec["num_nodes"], k, spec["max_anchors"])
    return build_tree(spec["topk_acc"], spec["num_nodes"])


# ---- speed sweep ----------------------------------------------------------------------------


def validation_prompts(tokenizer, n: int, max_prompt_tokens: int, val_fraction: float) -> list:
    """First user turns of ShareGPT's validation split, rendered as one-turn chat prompts."""
    from drafters.data.chat import render_prompt
    from drafters.data.sharegpt import read_conversations

    prompts = []
    for conv in read_conversations("sharegpt-package", split="validation",
                                   val_fraction=val_fraction):  # fmt: skip
        first = next(m for m in conv.messages if m["role"] == "user")
        ids = render_prompt(tokenizer, [first])
        if len(ids) <= max_prompt_tokens:
            prompts.append({"id": conv.id, "ids": ids})
        if len(prompts) == n:
            break
    return prompts


def sweep(target, prompts: list[dict], methods: list, max_new_tokens: int) -> dict:
    """{name: {tokens_per_s, tau, vs_ar, new_tokens, seconds, forwards}} for bench `Method`s
    (the first one, the AR loop, is the reference), prompt-major; every output is checked
    against the first method's."""
    from drafters.decoding.result import sync_clock

    stats = {
        m.name: {"new_tokens": 0, "emitted": 0, "seconds": 0.0, "forwards": 0} for m in methods
    }
    if prompts:  # untimed warm-up: a decoder's first call times the linears' forms on this
        # machine (drafters/decoding/linears.py, ~1.5 min for SmolLM2 without a kernel cache)
        # and HF's first generate sets itself up; neither belongs to the first method's time
        ids = torch.tensor([prompts[0]["ids"]], device=target.device)
        for m in methods:
            if m.before:
                m.before(ids)
            m.generate(ids, 4)
    for p in prompts:
        ids = torch.tensor([p["ids"]], device=target.device)
        ref = None
        for m in methods:
            if m.before:  # untimed set-up (the budget gate's step-cost profile, measured once)
                m.before(ids)
            t0 = sync_clock(target.device)
            out, info = m.generate(ids, max_new_tokens)
            seconds = sync_clock(target.device) - t0
            ref = out if ref is None else ref
            if out != ref:
                raise AssertionError(f"{m.name}: output differs from {methods[0].name} on "
                                     f"ShareGPT {p['id']}: a decoder bug")  # fmt: skip
            s = stats[m.name]
            s["new_tokens"] += len(out)
            s["emitted"] += max(len(out) - 1, 0)
            s["seconds"] += seconds
            s["forwards"] += info.get("verify_forwards", 0)
        print(f"[tune] prompt {p['id']}: " + ", ".join(
            f"{n} {s['new_tokens'] / max(s['seconds'], 1e-9):.1f}" for n, s in stats.items()
        ), file=sys.stderr, flush=True)  # fmt: skip
    for s in stats.values():
        s["tokens_per_s"] = s["new_tokens"] / s["seconds"] if s["seconds"] else None
        s["tau"] = s.pop("emitted") / s["forwards"] if s["forwards"] else None
        s["forwards"] = s["forwards"] or None  # HF methods do not count theirs
    base = stats[methods[0].name]["tokens_per_s"]
    for s in stats.values():
        s["vs_ar"] = s["tokens_per_s"] / base if base and s["tokens_per_s"] else None
    return stats


# ---- entry point ----------------------------------------------------------------------------


def tune_drafter(args, target, folder: str, prompts: list[dict], batches: dict) -> dict:
    """batches: aux layers -> held-out batches carrying those features, filled as needed."""
    from drafters.eval.methods import ar_method, drafter_method
    from drafters.export import load_drafter
    from drafters.models import aux_layers_of

    drafter = load_drafter(folder, target)
    aux = aux_layers_of(drafter.model)
    if aux not in batches:
        batches[aux] = heldout_batches(target, args.dataset_dir, args.cache_dir, args.max_length,
                                       args.val_fraction, aux)  # fmt: skip
    acc, totals = topk_accuracy(drafter, target, batches[aux], args.topk)
    positions = totals[0] if drafter.kind == "falcon" else min(totals)  # roots / head positions
    print(f"[tune] {drafter.name}: top-1 accuracy per depth "
          f"{[round(r[0], 3) for r in acc]} over {positions} held-out roots or positions",
          file=sys.stderr)  # fmt: skip
    specs = {f"tree{n}": tree_input(drafter, acc, n) for n in args.snapped_sizes}
    trees = {name: build(drafter, spec) for name, spec in specs.items()}
    methods = [ar_method(target)]
    methods += [drafter_method(target, drafter, None, n, t.to_list()) for n, t in trees.items()]
    dynamic = dynamic_methods(target, drafter, [len(t) for t in trees.values()]) if args.dynamic \
        else []  # fmt: skip
    stats = sweep(target, prompts, methods + dynamic, args.max_new_tokens)
    best = max(trees, key=lambda n: stats[n]["tokens_per_s"])
    for name, t in trees.items():
        stats[name].update(nodes=len(t), depth=t.depth)
    for m in dynamic:  # a fixed budget's node count; None: sized per step
        stats[m.name].update(nodes=m.info.get("dynamic", {}).get("budget"))
    fastest = max(stats, key=lambda n: stats[n]["tokens_per_s"] or 0.0)
    result = {"drafter": str(folder), "name": drafter.name, "kind": drafter.kind,
              "sizes": args.snapped_sizes, "topk_acc": acc, "heldout_positions": positions,
              "row_totals": totals,
              "sweep": stats,
              "chosen": best, "chosen_tree": trees[best].to_list(),
              "fastest": fastest}  # fmt: skip
    out = Path(args.out)
    (out / f"{drafter.name}.tree.json").write_text(json.dumps(specs[best]))
    (out / f"{drafter.name}.json").write_text(json.dumps(result, indent=1))
    print(f"[tune] {drafter.name}: chose {best} ({len(trees[best])} nodes, "
          f"{stats[best]['vs_ar']:.2f}x of the AR loop, tau {stats[best]['tau']:.2f})",
          file=sys.stderr)  # fmt: skip
    for name, t in trees.items() if dynamic else ():
        dyn = stats[f"dynamic{len(t)}"]
        print(f"[tune] {drafter.name}: {len(t)} nodes a step, tau static {stats[name]['tau']:.2f}"
              f" vs dynamic {dyn['tau']:.2f}; tokens/s {stats[name]['tokens_per_s']:.1f} vs "
              f"{dyn['tokens_per_s']:.1f}", file=sys.stderr)  # fmt: skip
    if fastest not in trees:
        what = {"ar": "no tree pays", "budget": "`--gate budget`: the tree sized per step"}.get(
            fastest,
            "a dynamic tree of a fixed size: `drafters-generate --gate budget --nodes N`,"
            " `drafters-bench --drafter DIR@dynamicN`",
        )
        print(f"[tune] {drafter.name}: fastest overall {fastest} ({what}; "
              f"{stats[fastest]['vs_ar']:.2f}x of the AR loop); the export keeps the fastest "
              "static tree", file=sys.stderr)  # fmt: skip
    return result


def dynamic_methods(target, drafter, sizes: list[int]) -> list:
    """The dynamic tree (`--gate budget`, no n-gram candidates) at each static tree's node count
    (`dynamic<n>`: the n best candidates by the drafter's own confidence every step, so τ
    compares the two at equal verify cost), and sized per step by the measured cost (`budget`)."""
    from drafters.eval.methods import drafter_method, fixed_size_gate

    methods = []
    for n in sorted(set(sizes)):  # the bench's dynamic<n>, the same config
        gate, cfg = fixed_size_gate(f"dynamic{n}")
        methods.append(drafter_method(target, drafter, gate, f"dynamic{n}", dynamic=cfg))
    return [*methods, drafter_method(target, drafter, "budget", "budget")]


def tune_peers(args, target, prompts: list[dict]) -> dict:
    from drafters.eval.methods import ar_method, hf_method

    layers = target.config.num_hidden_layers
    methods = [ar_method(target), hf_method(target, "hf_greedy")]
    for n in args.prompt_lookup:
        methods.append(hf_method(target, f"prompt_lookup_{n}", prompt_lookup_num_tokens=n))
    early_exit = {}  # method name -> (layer, num_assistant_tokens, assistant_confidence_threshold)
    for layer in sorted({max(1, round(layers * frac)) for frac in args.early_exit_fractions}):
        for n in args.early_exit_tokens:
            for thr in args.early_exit_thresholds:
                name = f"early_exit_{layer}_{n}_{thr:g}"
                early_exit[name] = (layer, n, thr)
                methods.append(hf_method(target, name, assistant_early_exit=layer,
                                         num_assistant_tokens=n,
                                         assistant_confidence_threshold=thr))  # fmt: skip
    stats = sweep(target, prompts, methods, args.max_new_tokens)

    def best(prefix):
        return max((n for n in stats if n.startswith(prefix)),
                   key=lambda n: stats[n]["tokens_per_s"])  # fmt: skip

    layer, tokens, thr = early_exit[best("early_exit_")]
    result = {"sweep": stats, "prompt_lookup": int(best("prompt_lookup_").rsplit("_", 1)[1]),
              "early_exit_layer": layer, "early_exit_tokens": tokens,
              "early_exit_threshold": thr}  # fmt: skip
    (Path(args.out) / "peers.json").write_text(json.dumps(result, indent=1))
    print(f"[tune] peers: prompt_lookup_num_tokens {result['prompt_lookup']}, "
          f"assistant_early_exit {layer} with num_assistant_tokens {tokens} and "
          f"assistant_confidence_threshold {thr:g}", file=sys.stderr)  # fmt: skip
    return result


def tune(args) -> None:
    """Tune every --drafter and, with --peers, the HF peers (the options of `drafters-tune`)."""
    from drafters.export import load_drafter, read_config
    from drafters.target import load_target

    if not args.drafter and not args.peers:
        raise ValueError("nothing to tune: give --drafter FOLDER and/or --peers")
    if args.threads:
        torch.set_num_threads(args.threads)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    identity = read_config(args.drafter[0])["target"] if args.drafter else None
    target = load_target(args.target, identity)
    for folder in args.drafter:  # a corrupt or mismatched drafter fails now, not after the sweep
        load_drafter(folder, target)
    t0 = time.perf_counter()
    prompts = validation_prompts(target.tokenizer, args.prompts, args.max_prompt_tokens,
                                 args.sharegpt_val_fraction)  # fmt: skip
    if args.peers:
        tune_peers(args, target, prompts)
    if args.drafter:
        args.snapped_sizes = args.sizes
        if args.snap:
            from drafters.decoding.cost import forward_cost_profile, snap_sizes

            profile = forward_cost_profile(target, max_rows=max(args.sizes) + 9)
            args.snapped_sizes = snap_sizes(profile, args.sizes)
            print(f"[tune] forward cost by rows t(n)/t(1): {[round(x, 2) for x in profile]}; "
                  f"tree sizes {args.sizes} -> {args.snapped_sizes}", file=sys.stderr)  # fmt: skip
        batches: dict = {}
        for folder in args.drafter:
            tune_drafter(args, target, folder, prompts, batches)
    print(f"[tune] done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
