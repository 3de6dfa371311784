"""`drafters-tune` on the tiny target: held-out top-k accuracies, the tree-size sweep on ShareGPT
validation prompts, the chosen tree as `drafters-export --tree` input, the HF peers' knobs."""

import json

import pytest

from drafters.cli import tune_main
from drafters.export import export_checkpoint, load_drafter


def test_tune_chooses_a_tree_per_drafter(tmp_path, tiny_distilled, heldout_cache, tiny_exported,
                                         tiny_checkpoints):  # fmt: skip
    out = tmp_path / "tune"
    argv = ["--out", str(out), "--peers", "--prompts", "2", "--max-new-tokens", "8",
            "--sizes", "2", "4", "--no-snap", "--threads", "1",
            "--dataset-dir", str(tiny_distilled),
            "--cache-dir", str(heldout_cache), "--max-length", "64",
            "--prompt-lookup", "2", "3", "--early-exit-thresholds", "0", "0.5"]  # fmt: skip
    for kind in ("medusa", "falcon"):
        argv += ["--drafter", str(tiny_exported[kind])]
    assert tune_main(argv) == 0

    peers = json.loads((out / "peers.json").read_text())
    assert peers["prompt_lookup"] in (2, 3) and peers["early_exit_layer"] >= 1
    assert peers["early_exit_tokens"] in (3, 20) and peers["early_exit_threshold"] in (0, 0.5)
    assert {"early_exit_1_3_0", "early_exit_1_20_0.5"} <= set(peers["sweep"])
    assert {"ar", "hf_greedy", "prompt_lookup_2", "prompt_lookup_3"} <= set(peers["sweep"])
    for kind in ("medusa", "falcon"):
        name = f"{kind}_tiny"
        res = json.loads((out / f"{name}.json").read_text())
        assert res["chosen"] in ("tree2", "tree4")
        acc = res["topk_acc"]
        assert all(0.0 <= sum(row) <= 1.0 + 1e-9 for row in acc) and res["heldout_positions"] > 0
        s = res["sweep"]
        assert s["tree4"]["nodes"] == 4 and s["tree2"]["nodes"] == 2 and s["ar"]["tau"] == 1.0
        assert s[res["chosen"]]["tokens_per_s"] == max(
            s[t]["tokens_per_s"] for t in ("tree2", "tree4")
        )
        # the dynamic tree at each static tree's node count, and sized per step, in the same
        # (lossless-checked) sweep; the fastest of all named
        assert s["dynamic2"]["nodes"] == 2 and s["dynamic4"]["nodes"] == 4
        assert s["budget"]["nodes"] is None
        assert s[res["fastest"]]["tokens_per_s"] == max(x["tokens_per_s"] for x in s.values())
        # the tree file rebuilds the chosen tree at export
        folder = export_checkpoint(tiny_checkpoints[kind], tmp_path / f"re_{kind}",
                                   tree=str(out / f"{name}.tree.json"))  # fmt: skip
        assert load_drafter(folder).config["tree"]["spec"] == res["chosen_tree"]


def test_snap_sizes_moves_each_size_below_the_next_cost_step():
    from drafters.decoding.cost import snap_sizes

    # t(n)/t(1) for n = 1..12: flat to 3 rows, a step at 4, flat to 9 rows, a step at 10
    profile = [1.0, 1.02, 1.03, 1.3, 1.31, 1.32, 1.33, 1.34, 1.35, 1.8, 1.81, 1.82]
    assert snap_sizes(profile, [1, 2, 3, 5, 8]) == [2, 8]  # 3 and 9 rows: below the steps
    assert snap_sizes(profile, [11, 20]) == [11]  # capped by the profile
    assert snap_sizes(profile, [3], step=0.5) == [11]  # a coarser step: nothing is a step


def test_forward_cost_profile_on_the_tiny_target(tiny):
    from drafters.decoding.cost import forward_cost_profile

    profile = forward_cost_profile(tiny, max_rows=5, prompt_len=8, reps=1)
    assert len(profile) == 5 and profile[0] == 1.0 and all(x > 0 for x in profile)


def test_tune_rates_a_fused_falcon_as_training_validates_it(tmp_path, tiny, tiny_distilled):
    """An EAGLE-3-layout Falcon over fused target layers: tune's held-out batches carry those
    layers, and its depth-1 and depth-2 top-1 rates equal training validation's `acc_depth{d}`
    on the same batches (they once carried f only, which the drafter took for its own output,
    and tune ranked a 0.72 drafter at 0.23)."""
    from pathlib import Path
    from types import SimpleNamespace

    import torch
    from hydra.utils import instantiate
    from train_helpers import EAGLE3_AUX, compose_config, tiny_overrides

    from drafters.eval.tune import heldout_batches, topk_accuracy
    from drafters.models import aux_layers_of
    from drafters.training.feature_cache import build_feature_cache
    from drafters.training.run import build_module

    cfg = compose_config("train", tiny_overrides(tmp_path, tiny_distilled, *EAGLE3_AUX))
    dm = instantiate(cfg.data).attach(tiny)
    dm.setup()
    cache = Path(cfg.data.cache_dir)
    build_feature_cache(tiny, dm.val_set, cache / "validation", "float32",
                        aux_layers=dm.aux_layers)  # fmt: skip
    module = build_module(cfg, tiny)
    assert aux_layers_of(module.drafter) == (1,)
    batches = heldout_batches(tiny, str(tiny_distilled), str(cache), cfg.data.max_length,
                              cfg.data.val_fraction, aux_layers_of(module.drafter))  # fmt: skip
    assert batches and batches[0]["features"].shape[-1] == 2 * tiny.hidden_size
    # fit the first batch a little, so the rates compared are not all 0
    opt = torch.optim.Adam(module.drafter.parameters(), lr=3e-3)
    for _ in range(30):
        loss, _, _ = module.compute_loss(batches[0], train=True)
        opt.zero_grad()
        loss.backward()
        opt.step()
    module.eval()
    drafter = SimpleNamespace(kind="falcon", model=module.drafter)
    rates = []
    for b in batches:
        with torch.no_grad():
            _, m, _ = module.compute_loss(b, train=False)
        acc, _ = topk_accuracy(drafter, tiny, [b], topk=1)
        want = [float(m["acc_depth1"]), float(m["acc_depth2"])]
        assert [acc[0][0], acc[1][0]] == pytest.approx(want, abs=1e-6)
        rates += want
    assert max(rates) > 0.1
