"""Export: checkpoint -> drafter folder -> `load_drafter`; same outputs, refusals, atomicity, and
lossless speculative decoding with every exported drafter on the tiny target."""

import json
import math
import shutil
import subprocess
import sys

import pytest
import torch

from drafters.export.format import DrafterMismatchError, ExportError, load_drafter
from drafters.export.from_checkpoint import export_checkpoint
from drafters.testing import tiny_target

KINDS = ["medusa", "cerberus", "falcon"]


def lit_module(ckpt_path):
    """The checkpoint's own DrafterLitModule (Lightning is fine in a test)."""
    from drafters.training.module import DrafterLitModule

    ckpt = torch.load(ckpt_path, weights_only=True)
    module = DrafterLitModule(**ckpt["hyper_parameters"])
    module.load_state_dict(ckpt["state_dict"])
    return module.eval()


def drafter_outputs(kind, model, target, gen_seed=0):
    gen = torch.Generator().manual_seed(gen_seed)
    f = torch.randn(2, 6, target.hidden_size, generator=gen)  # (B, T, d)
    with torch.no_grad():
        if kind == "falcon":
            tokens = torch.randint(target.vocab_size, (2, 6), generator=gen)
            return model(f, tokens, target.embed_tokens)  # (B, T, d)
        return model(f, target.lm_head)  # (B, T, K, V)


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_gives_the_checkpoints_outputs(kind, tiny, tiny_checkpoints, tiny_exported):
    module = lit_module(tiny_checkpoints[kind])
    d = load_drafter(tiny_exported[kind], tiny)
    assert d.kind == kind and not d.model.training
    assert not any(p.requires_grad for p in d.model.parameters())
    for seed in (0, 1):
        ref = drafter_outputs(kind, module.drafter, tiny, seed)
        assert torch.equal(drafter_outputs(kind, d.model, tiny, seed), ref)
    logits = torch.randn(5, tiny.vocab_size)
    f = torch.randn(5, tiny.hidden_size)
    if kind == "cerberus":  # trained with the learned gate: the default
        assert d.gate is d.gates["learned"]
        torch.testing.assert_close(d.gate(f, logits), module.gate(f, logits), rtol=0, atol=0)
    if kind in ("medusa", "cerberus"):  # both carry the entropy calibration from validation
        eg = d.gates["entropy"]
        assert torch.equal(eg.edges, module.entropy_gate.edges)
        assert torch.equal(eg.values, module.entropy_gate.values)
        assert bool(eg.fitted) and torch.equal(eg(f, logits), module.entropy_gate(f, logits))
    if kind in ("medusa", "falcon"):
        assert d.gate is None
    if kind == "falcon":
        assert d.gates == {}


def test_config_schema_and_weights_are_the_drafters_only(tiny, tiny_exported):
    for kind, folder in tiny_exported.items():
        cfg = json.loads((folder / "config.json").read_text())
        assert cfg["format"] == "drafters.drafter" and cfg["format_version"] == 1
        assert cfg["kind"] == kind and cfg["target"] == tiny.identity.to_dict()
        assert set(cfg["gate"]) == {"default", "trained", "entropy", "learned"}
        assert cfg["weights"]["dtype"] == "float32"
        assert cfg["source"]["global_step"] == 3
        shapes = cfg["weights"]["tensors"]
        assert all(k.startswith(("drafter.", "gate.")) for k in shapes)
        assert any(k.startswith("gate.") for k in shapes) == (kind == "cerberus")
        assert not [k for k, s in shapes.items() if s[:1] == [tiny.vocab_size]]  # no LM head
        if kind == "falcon":
            assert cfg["tree"]["name"] == "kmask2_8layer_tree" and len(cfg["tree"]["spec"]) == 165
            assert len(load_drafter(folder).tree) == 165
        else:
            assert cfg["tree"]["name"] == "mc_sim_7b_63" and len(cfg["tree"]["spec"]) == 63
            assert len(load_drafter(folder).tree) == 63


def test_loading_imports_neither_lightning_nor_hydra(tiny_exported):
    code = (
        "import sys, drafters\n"
        f"d = drafters.load_drafter({str(tiny_exported['cerberus'])!r})\n"
        "bad = [m for m in ('lightning', 'pytorch_lightning', 'hydra', 'omegaconf') "
        "if m in sys.modules]\n"
        "assert not bad, bad\n"
        "print(d.kind, type(d.model).__name__, type(d.gate).__name__)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["cerberus", "CerberusHeads", "LearnedGate"]


def test_bfloat16_export(tmp_path, tiny, tiny_checkpoints):
    from safetensors.torch import load_file

    out = export_checkpoint(tiny_checkpoints["cerberus"], tmp_path / "bf16", dtype="bfloat16")
    tensors = load_file(str(out / "model.safetensors"))
    assert {t.dtype for t in tensors.values() if t.is_floating_point()} == {torch.bfloat16}
    assert tensors["drafter.vocab.ids"].dtype == torch.int64  # the draft vocabulary stays exact
    assert next(load_drafter(out).model.parameters()).dtype == torch.bfloat16  # as stored
    d = load_drafter(out, tiny)  # on a float32 target: cast to the target's dtype
    assert next(d.model.parameters()).dtype == torch.float32
    ref = drafter_outputs("cerberus", lit_module(tiny_checkpoints["cerberus"]).drafter, tiny)
    torch.testing.assert_close(drafter_outputs("cerberus", d.model, tiny), ref, atol=0.1, rtol=0.05)


def test_another_target_is_refused_naming_both(tiny_exported):
    other = tiny_target(hidden_size=32, name="other-llama")
    with pytest.raises(DrafterMismatchError) as e:
        load_drafter(tiny_exported["medusa"], other)
    msg = str(e.value)
    assert "tiny-random-llama-seed0" in msg and "other-llama-seed0" in msg and "hidden_size" in msg

    retok = tiny_target(seed=0)  # same weights, one token added to the tokenizer
    retok.tokenizer.add_tokens(["<|extra|>"])
    retok._identity = None
    with pytest.raises(DrafterMismatchError, match="tokenizer_hash"):
        load_drafter(tiny_exported["cerberus"], retok)


def test_another_model_with_the_same_shapes_is_refused(tmp_path, tiny, tiny_exported):
    """seed 1 has seed 0's architecture and tokenizer but other weights: not its drafter. A
    drafter exported before the weights fingerprint still loads on its own target."""
    from drafters.target_identity import LEGACY_KEYS

    seed1 = tiny_target(seed=1)
    with pytest.raises(DrafterMismatchError, match="weights_hash") as e:
        load_drafter(tiny_exported["medusa"], seed1)
    assert "tiny-random-llama-seed0" in str(e.value) and "tiny-random-llama-seed1" in str(e.value)

    old = shutil.copytree(tiny_exported["medusa"], tmp_path / "old")
    cfg = json.loads((old / "config.json").read_text())
    cfg["target"] = {k: cfg["target"][k] for k in LEGACY_KEYS}
    (old / "config.json").write_text(json.dumps(cfg))
    load_drafter(old, tiny)
    with pytest.raises(DrafterMismatchError, match="name: .*seed0.*seed1"):
        load_drafter(old, seed1)


def rewrite(ckpt_path, out_path, edit):
    ckpt = torch.load(ckpt_path, weights_only=True)
    edit(ckpt)
    torch.save(ckpt, out_path)
    return out_path


@pytest.mark.parametrize(
    "name, edit, match",
    [
        ("missing_key", lambda c: c["state_dict"].pop("drafter.layers.1.bias"), "missing"),
        ("no_gate", lambda c: c["state_dict"].pop("gate.fc1.weight"), "learned gate.*missing"),
        ("wrong_kind", lambda c: c["hyper_parameters"].update(kind="medusa"), "unknown keys"),
        ("unknown_kind", lambda c: c["hyper_parameters"].update(kind="eagle"), "unknown drafter"),
        (
            "unknown_config_key",
            lambda c: c["hyper_parameters"]["model"].update(dropout=0.1),
            "unknown keys \\['dropout'\\]",
        ),
        (
            "shape",
            lambda c: c["state_dict"].update({"drafter.layers.0.bias": torch.zeros(4, 65)}),
            "shape mismatch layers.0.bias: file \\(4, 65\\), model \\(4, 64\\)",
        ),
        ("no_state_dict", lambda c: c.pop("state_dict"), "missing \\['state_dict'\\]"),
        ("no_target", lambda c: c["hyper_parameters"].pop("target"), "lack \\['target'\\]"),
    ],
)
def test_bad_checkpoints_are_refused_naming_the_file(tmp_path, tiny_checkpoints, name, edit, match):
    bad = rewrite(tiny_checkpoints["cerberus"], tmp_path / f"{name}.ckpt", edit)
    with pytest.raises(ExportError, match=match) as e:
        export_checkpoint(bad, tmp_path / "out")
    assert str(bad) in str(e.value)
    assert not (tmp_path / "out").exists()


def test_truncated_checkpoint_is_refused(tmp_path, tiny_checkpoints):
    data = tiny_checkpoints["medusa"].read_bytes()
    bad = tmp_path / "truncated.ckpt"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(ExportError, match="truncated") as e:
        export_checkpoint(bad, tmp_path / "out")
    assert str(bad) in str(e.value)
    with pytest.raises(FileNotFoundError, match="nothing.ckpt"):
        export_checkpoint(tmp_path / "nothing.ckpt", tmp_path / "out")


def test_interrupted_export_leaves_no_loadable_folder(tmp_path, tiny_checkpoints, monkeypatch):
    import drafters.export.from_checkpoint as E
    import drafters.io_utils as io

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # e.g. Ctrl-C while config.json is being written

    parent = tmp_path / "drafters"
    monkeypatch.setattr(E, "_write_config", killed)
    with pytest.raises(KeyboardInterrupt):
        export_checkpoint(tiny_checkpoints["medusa"], parent / "medusa")
    assert list(parent.iterdir()) == []  # neither the folder nor a leftover temporary one

    # a hard kill skips the clean-up: the half-written temporary folder must not load
    monkeypatch.setattr(io.shutil, "rmtree", lambda *a, **k: None)
    with pytest.raises(KeyboardInterrupt):
        export_checkpoint(tiny_checkpoints["medusa"], parent / "medusa")
    (partial,) = parent.iterdir()
    assert partial.name.startswith(".medusa.partial-") and (partial / "model.safetensors").exists()
    with pytest.raises(ExportError, match="no config.json.*interrupted export"):
        load_drafter(partial)
    with pytest.raises(FileNotFoundError):
        load_drafter(parent / "medusa")


def test_overwrite_and_damaged_folders(tmp_path, tiny_checkpoints):
    out = export_checkpoint(tiny_checkpoints["medusa"], tmp_path / "d")
    with pytest.raises(FileExistsError):
        export_checkpoint(tiny_checkpoints["cerberus"], out)
    export_checkpoint(tiny_checkpoints["cerberus"], out, overwrite=True)
    assert load_drafter(out).kind == "cerberus"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]

    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    w = bad / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-100])
    with pytest.raises(ExportError, match="checksum"):
        load_drafter(bad)
    shutil.copy(out / "model.safetensors", w)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "format_version": 2}))
    with pytest.raises(ExportError, match="format_version 2"):
        load_drafter(bad)
    (bad / "config.json").write_text(json.dumps({**cfg, "extra": 1}))
    with pytest.raises(ExportError, match="unknown keys \\['extra'\\]"):
        load_drafter(bad)
    (bad / "config.json").write_text(json.dumps({**cfg, "tree": {"name": None, "spec": [[0, 1]]}}))
    with pytest.raises(ExportError, match="bad gate or tree entry.*no parent"):
        load_drafter(bad)
    cfg["model"]["num_heads"] = 5  # the config no longer fits the weights
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExportError, match="shape mismatch layers.0.bias: file \\(4, 64\\)"):
        load_drafter(bad)


def test_trees(tmp_path, tiny_checkpoints):
    ckpt = tiny_checkpoints["medusa"]
    small = export_checkpoint(ckpt, tmp_path / "a", tree="mc_sim_7b_63_first16")
    assert len(load_drafter(small).tree) == 16
    assert load_drafter(export_checkpoint(ckpt, tmp_path / "b", tree="chain3")).tree.depth == 3
    acc = tmp_path / "acc.json"
    acc.write_text(json.dumps({"topk_acc": [[0.6, 0.2, 0.1]] * 4, "num_nodes": 10}))
    built = load_drafter(export_checkpoint(ckpt, tmp_path / "c", tree=str(acc)))
    assert len(built.tree) == 10 and built.config["tree"]["name"] == "built"
    with pytest.raises(ExportError, match="depth 5"):
        export_checkpoint(ckpt, tmp_path / "d", tree="chain5")
    with pytest.raises(ExportError, match="unknown tree 'nope'"):
        export_checkpoint(ckpt, tmp_path / "d", tree="nope")


def test_falcon_trees(tmp_path, tiny_checkpoints):
    ckpt = tiny_checkpoints["falcon"]
    small = load_drafter(export_checkpoint(ckpt, tmp_path / "a", tree="falcon_k2_32"))
    assert len(small.tree) == 32 and small.config["tree"]["name"] == "falcon_k2_32"
    assert load_drafter(export_checkpoint(ckpt, tmp_path / "b", tree="chain")).tree.depth == 8
    acc = tmp_path / "acc.json"
    acc.write_text(json.dumps({"topk_acc": [[0.7, 0.2]] * 6, "num_nodes": 12, "max_anchors": 2}))
    built = load_drafter(export_checkpoint(ckpt, tmp_path / "c", tree=str(acc)))
    assert len(built.tree) == 12 and built.tree.depth <= 6
    with pytest.raises(ExportError, match="Falcon tree 'nope'"):
        export_checkpoint(ckpt, tmp_path / "d", tree="nope")


def test_export_command(tmp_path, tiny_checkpoints, capsys):
    from drafters.cli import export_main as main
    from drafters.cli import run

    out = tmp_path / "exp"
    assert run(main, [str(tiny_checkpoints["cerberus"]), str(out), "--dtype", "float16"]) == 0
    assert "cerberus drafter" in capsys.readouterr().out
    assert load_drafter(out).config["weights"]["dtype"] == "float16"
    assert run(main, [str(tiny_checkpoints["cerberus"]), str(out)]) == 1  # exists, no --force
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "exists" in err and err.count("\n") == 1
    assert run(main, [str(tiny_checkpoints["medusa"]), str(out), "--tree", "[[0], [0, 0]]",
                      "--force"]) == 0  # fmt: skip
    assert len(load_drafter(out).tree) == 2


def greedy(target, ids, n):
    mask = torch.ones_like(ids)
    return target.model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n)


@pytest.mark.parametrize(
    "kind, gate",
    [
        ("medusa", "none"),
        ("medusa", "entropy"),
        ("cerberus", "none"),
        ("cerberus", "learned"),
        ("cerberus", "entropy"),
        ("falcon", "none"),
    ],
)
def test_speculative_decoding_with_exported_drafters_is_lossless(kind, gate, tiny, tiny_exported):
    from drafters.data.chat import render_prompt
    from drafters.speculate import speculative_decode

    d = load_drafter(tiny_exported[kind], tiny)
    for text in ("Tell me about topic number 3.", "More, please."):
        ids = torch.tensor([render_prompt(tiny.tokenizer, [{"role": "user", "content": text}])])
        for n in (1, 37):
            ref = greedy(tiny, ids, n)
            res = speculative_decode(tiny, d, ids, n, gate=gate)
            assert torch.equal(res.sequences, ref), (kind, gate, text, n)
            if n > 1:
                assert res.tau >= 1.0 and res.verify_forwards > 0
                assert math.isfinite(res.alpha)
    if gate == "none" and kind != "falcon":
        assert res.ar_steps == 0  # no gate: every step is a tree step


def test_gate_errors(tiny, tiny_exported):
    from drafters.speculate import speculative_decode

    ids = tiny.tokenizer("hi", return_tensors="pt").input_ids
    with pytest.raises(ValueError, match="has no learned gate; it has: entropy"):
        speculative_decode(tiny, load_drafter(tiny_exported["medusa"], tiny), ids, 4, "learned")
    with pytest.raises(ValueError, match="no gate"):
        speculative_decode(tiny, load_drafter(tiny_exported["falcon"], tiny), ids, 4, "entropy")


def test_exported_files_are_readable_by_others(tmp_path, tiny_checkpoints):
    import os

    old = os.umask(0o022)
    try:
        out = export_checkpoint(tiny_checkpoints["medusa"], tmp_path / "shared")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in [out, *out.iterdir()]}
    assert modes == {"shared": 0o755, "config.json": 0o644, "model.safetensors": 0o644}
