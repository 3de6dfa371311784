"""The console scripts: each resolves, and a bad input gives one `error:` line and exit code 1,
not a traceback."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import torch
from train_helpers import ROOT

import drafters.cli as cli
from drafters.cli import bench_main, bench_vllm_main, export_main, generate_main, run, tune_main

SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_every_console_script_resolves():
    assert set(SCRIPTS) == {
        "drafters-export",
        "drafters-generate",
        "drafters-bench",
        "drafters-tune",
        "drafters-bench-vllm",
    }
    for name, entry in SCRIPTS.items():
        module, func = entry.split(":")
        assert module == "drafters.cli" and callable(getattr(cli, func)), name


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err, err
    assert err.count("\n") <= 2, err  # the problem, and where it names one the command to fix it
    return err


@pytest.fixture
def corrupt_drafter(tmp_path, tiny_exported):
    folder = tmp_path / "corrupt"
    shutil.copytree(tiny_exported["cerberus"], folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])  # cut short: the checksum no longer matches
    return folder


def test_a_corrupt_drafter(corrupt_drafter, capsys):
    argv = ["--drafter", str(corrupt_drafter), "--prompt", "hi", "--threads", "1"]
    assert run(generate_main, argv) == 1
    assert "model.safetensors" in one_error_line(capsys)
    argv = [
        "--drafter",
        str(corrupt_drafter),
        "--methods",
        "ar",
        "--out",
        "unused",
        "--threads",
        "1",
    ]
    assert run(bench_main, argv) == 1
    assert "model.safetensors" in one_error_line(capsys)
    assert run(tune_main, ["--drafter", str(corrupt_drafter), "--out", "unused"]) == 1
    one_error_line(capsys)


def test_a_bad_prompt_file(tmp_path, tiny_exported, capsys):
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"question_id": 1, "category": "x", "turns": ["hi"]}\n{"oops"\n')
    argv = ["--questions", str(bad), "--target", "tiny", "--methods", "ar", "--out", str(tmp_path)]
    assert run(bench_main, argv) == 1
    assert f"{bad}:2: not JSON" in one_error_line(capsys)
    argv[1] = str(tmp_path / "missing.jsonl")
    assert run(bench_main, argv) == 1
    assert "missing.jsonl does not exist" in one_error_line(capsys)


def test_missing_inputs(tmp_path, capsys):
    assert run(generate_main, ["--drafter", str(tmp_path / "nope"), "--prompt", "hi"]) == 1
    assert "does not exist" in one_error_line(capsys)
    assert run(export_main, [str(tmp_path / "no.ckpt"), str(tmp_path / "out")]) == 1
    assert "no.ckpt" in one_error_line(capsys)
    assert run(tune_main, ["--out", str(tmp_path)]) == 1
    assert "nothing to tune" in one_error_line(capsys)


def test_the_installed_script_exits_nonzero_with_one_line(tmp_path):
    script = Path(sys.executable).parent / "drafters-generate"
    if not script.is_file():
        pytest.skip("the package is not installed in this environment (pip install -e .)")
    res = subprocess.run(
        [str(script), "--drafter", str(tmp_path / "nope"), "--prompt", "hi"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 1 and res.stderr.startswith("error: ")
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr


def test_python_dash_m_runs_the_same_commands(capsys):
    assert cli.main(["nope"]) == 2
    usage = "usage: python -m drafters.cli {export,generate,bench,tune,bench-vllm}"
    assert usage in capsys.readouterr().err
    assert cli.main(["tune", "--out", "x"]) == 1
    assert "nothing to tune" in one_error_line(capsys)


def test_vllm_commands_name_what_is_wrong(tmp_path, tiny_exported, capsys):
    """bench-vllm on a folder that is not a vLLM export; export --format vllm of a drafter vLLM
    cannot express (the fixture's drafters have a draft vocabulary; Cerberus has linked heads)."""
    argv = ["--drafter", str(tiny_exported["medusa"]), "--out", str(tmp_path / "b")]
    assert run(bench_vllm_main, argv) == 1
    assert "not a vLLM export" in one_error_line(capsys)
    for kind, field in (("medusa", "draft_vocab_size"), ("cerberus", "kind=cerberus")):
        argv = [str(tiny_exported[kind]), str(tmp_path / kind), "--format", "vllm"]
        assert run(export_main, argv) == 1
        assert field in one_error_line(capsys)
        assert not (tmp_path / kind).exists()
    # speculators' format: EAGLE-3 with fused target layers only (the fixture's is k=2 linear)
    argv = [str(tiny_exported["falcon"]), str(tmp_path / "spec"), "--format", "speculators"]
    assert run(export_main, argv) == 1
    assert "fusion/aux_layers" in one_error_line(capsys)


def test_export_format_vllm_from_a_checkpoint_and_from_a_folder(
    tmp_path, tiny, tiny_checkpoints, tiny_exported, capsys
):
    """Both sources give the same vLLM folder; the target's LM head is read from the drafter's
    target (here the tiny one, by its identity) and the command prints how to load it."""
    import json

    from safetensors.torch import load_file

    outs = []
    for i, source in enumerate((tiny_checkpoints["medusa"], tiny_exported["medusa"])):
        out = tmp_path / f"vllm{i}"
        argv = [str(source), str(out), "--format", "vllm", "--full-vocab"]
        assert run(export_main, argv) == 0
        assert '"method": "medusa"' in capsys.readouterr().out
        outs.append(load_file(str(out / "model.safetensors")))
        assert json.loads((out / "config.json").read_text())["model_type"] == "medusa"
    assert outs[0].keys() == outs[1].keys()
    assert all(torch.equal(outs[0][k], outs[1][k]) for k in outs[0])
    assert torch.equal(outs[0]["lm_heads.0.weight"], tiny.lm_head.weight)
