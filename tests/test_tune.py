"""`drafters-tune` on the tiny target: held-out top-k accuracies, the tree-size sweep on ShareGPT
validation prompts, the chosen tree as `drafters-export --tree` input, the HF peers' knobs."""

import json

from drafters.cli import tune_main
from drafters.export import export_checkpoint, load_drafter


def test_tune_chooses_a_tree_per_drafter(tmp_path, tiny_distilled, heldout_cache, tiny_exported,
                                         tiny_checkpoints):  # fmt: skip
    out = tmp_path / "tune"
    argv = ["--out", str(out), "--peers", "--prompts", "2", "--max-new-tokens", "8",
            "--sizes", "2", "4", "--threads", "1", "--dataset-dir", str(tiny_distilled),
            "--cache-dir", str(heldout_cache), "--max-length", "64",
            "--prompt-lookup", "2", "3"]  # fmt: skip
    for kind in ("medusa", "falcon"):
        argv += ["--drafter", str(tiny_exported[kind])]
    assert tune_main(argv) == 0

    peers = json.loads((out / "peers.json").read_text())
    assert peers["prompt_lookup"] in (2, 3) and peers["early_exit_layer"] >= 1
    assert peers["early_exit_tokens"] in (3, 20)
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
        # the tree file rebuilds the chosen tree at export
        folder = export_checkpoint(tiny_checkpoints[kind], tmp_path / f"re_{kind}",
                                   tree=str(out / f"{name}.tree.json"))  # fmt: skip
        assert load_drafter(folder).config["tree"]["spec"] == res["chosen_tree"]
