"""benchmarks/results.sh (docs/results.md's one command): the commands it runs compose and parse.

Its stages take hours, so they are checked through `results.sh plan`, which prints the train,
tune, bench and ship commands the stages run (the same functions build both): every training
run composes under Hydra with one shared budget rule, and the other commands parse.
"""

import json
import os
import shlex
import subprocess
import sys

import pytest
from omegaconf import OmegaConf
from train_helpers import ROOT, compose_config, load_script

from drafters.cli import bench_args, tune_args

# the runs results.sh trains, as the report reads them
RUNS = list(load_script("benchmarks/results_report.py").RUNS)
TABLES = {"mt_bench": "float32", "spec_bench": "float32", "mt_bench_bf16": "bfloat16"}
PEERS = {
    "prompt_lookup": 3,
    "early_exit_layer": 3,
    "early_exit_tokens": 20,
    "early_exit_threshold": 0.7,
}


def plan(out, peers=PEERS, **knobs) -> subprocess.CompletedProcess:
    if peers is not None:
        (out / "tune").mkdir(parents=True)
        (out / "tune" / "peers.json").write_text(json.dumps(peers))
    env = {**os.environ, "OUT": str(out), "PY": sys.executable, **knobs}
    return subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "results.sh"), "plan"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    res = plan(tmp_path_factory.mktemp("results"))
    assert res.returncode == 0, res.stderr
    cmds = {}
    for line in res.stdout.splitlines():
        if line.startswith("[results]"):
            continue
        label, cmd = line.split(": ", 1)
        cmds[label] = shlex.split(cmd)[1:]  # without the interpreter
    return cmds


def test_every_run_composes_with_one_training_budget(commands):
    cfgs = {}
    for name in RUNS:
        argv = commands[f"train {name}"]
        assert argv[0] == "train.py"
        cfgs[name] = compose_config("train", argv[1:])
        assert cfgs[name].run_name == f"results_{name}" and cfgs[name].ckpt_path == "last"

    def data(cfg):  # what the run trains on; aux_layers is which target features it reads
        return {k: v for k, v in OmegaConf.to_container(cfg.data, resolve=True).items()
                if k != "aux_layers"}  # fmt: skip

    budget = {n: (data(c), c.trainer, c.optim, c.callbacks.early_stopping) for n, c in cfgs.items()}
    assert all(b == budget["medusa"] for b in budget.values()), "runs differ in their budget"
    medusa = cfgs["medusa"]
    # the experiments' rule: up to 10 epochs and a 2,000-step cap, validation every 100 steps on
    # 64 held-out batches; early stopping and the exported checkpoint on the acceptance estimate
    assert medusa.trainer.max_steps == 2000 and medusa.trainer.max_epochs == 10
    assert medusa.trainer.val_check_interval == 100 and medusa.trainer.limit_val_batches == 64
    assert medusa.trainer.check_val_every_n_epoch is None
    assert medusa.data.max_length == 512 and medusa.data.features == "offline"
    assert medusa.callbacks.early_stopping.monitor == "val/accept_len_est"
    assert medusa.callbacks.best_checkpoint.monitor == "val/accept_len_est"
    assert cfgs["cerberus"].drafter.gate == "learned"
    falcons = ("falcon_k2_tf", "falcon_k2", "falcon_k3", "falcon_k2_paper")
    assert [cfgs[n].drafter.model.k for n in falcons] == [2, 2, 3, 2]
    assert cfgs["falcon_k2_tf"].drafter.csgd.teacher_forcing_only
    assert not cfgs["falcon_k2"].drafter.csgd.teacher_forcing_only
    assert [cfgs[n].drafter.csgd.variant for n in falcons[1:]] == ["decode", "decode", "paper"]
    fused = cfgs["falcon_k1_aux"].drafter.model  # EAGLE-3's layout over fused target layers
    assert (fused.k, fused.fusion, list(fused.aux_layers)) == (1, "eagle3", [2, 15, 27])


def test_tune_and_bench_commands_parse(commands, tmp_path):
    for name in [*RUNS, "peers"]:
        argv = commands[f"tune {name}"]
        assert argv[:3] == ["-m", "drafters.cli", "tune"]
        # trees and knobs are picked by speed, at the threads the bench runs them with
        assert tune_args(argv[3:]).threads == len(os.sched_getaffinity(0))
    for table, dtype in TABLES.items():
        argv = commands[f"bench {table}"]
        assert argv[:3] == ["-m", "drafters.cli", "bench"]
        args = bench_args(argv[3:])
        assert (args.bench, args.max_new_tokens, args.turns) == (table.split("_bf16")[0], 256, 2)
        assert (args.dtype or "float32") == dtype
        # one request at a time with the whole machine, as a user runs it
        assert args.shard == (0, 1) and args.threads == len(os.sched_getaffinity(0))
        assert (args.prompt_lookup, args.early_exit_layer, args.early_exit_tokens) == (3, 3, 20)
        assert args.early_exit_threshold == 0.7
        names = [d.split("@")[0].rsplit("/", 1)[1] for d in args.drafter]
        assert names == RUNS
        assert args.drafter[1].endswith("@none,entropy,learned,budget+learned")
        assert args.drafter[0].endswith("@none,hybrid") and args.drafter[3].endswith("@none,hybrid")
        assert args.drafter[6].endswith("@none,budget")
    assert bench_args(commands["bench spec_bench"][3:]).per_category == 10
    ship = commands["ship"]
    assert ship[:4] == ["-m", "drafters.eval.zoo", "ship", "--bench"]
    assert ship[4].endswith("bench/mt_bench")
    assert ship[ship.index("--out") + 1] == "zoo/smollm2_135m"


def test_bench_refuses_to_start_without_tuned_peers(tmp_path):
    res = plan(tmp_path, peers=None)
    assert res.returncode != 0
    assert "peers.json is missing: run the tune stage first" in res.stderr


def test_at_a_token_budget_the_runs_are_the_scaling_and_ablation_runs(tmp_path):
    """TOKENS=N trains on data_scaling.py's nested subset at N, with the same training config as
    its Medusa and Falcon runs and the Falcon ablation's, so results.sh reuses those finished
    runs (linked as results_<name>) instead of training them again; a finished run is found by
    `heldout.py finished` whatever its reporting settings (log_every_n_steps, progress bar)."""
    heldout = load_script("benchmarks/heldout.py")
    res = plan(tmp_path / "out", TOKENS="1000000")
    assert res.returncode == 0, res.stderr
    train = {}
    for line in res.stdout.splitlines():
        if line.startswith("train "):
            label, cmd = line.split(": ", 1)
            argv = shlex.split(cmd)[2:]  # without the interpreter and train.py
            exp = argv.pop(0).split("=", 1)[1]
            train[label.split()[1]] = (exp, argv)
    logs = str(tmp_path / "logs")
    scaling = ["data.max_train_tokens=1000000", "data.features=offline"]
    expect = {
        "medusa": ("medusa_smollm2", scaling),
        "falcon_k2": ("falcon_smollm2", scaling),
        "falcon_k2_tf": ("falcon_smollm2", [*scaling, "drafter.model.k=2",
                                             "drafter.csgd.teacher_forcing_only=true"]),
        "falcon_k3": ("falcon_smollm2", [*scaling, "drafter.model.k=3",
                                          "drafter.csgd.variant=decode"]),
        "falcon_k2_paper": ("falcon_smollm2", [*scaling, "drafter.model.k=2",
                                                "drafter.csgd.variant=paper"]),
        "falcon_k1_aux": ("falcon_eagle3_aux_smollm2", scaling),
    }  # fmt: skip
    for name, (exp, over) in expect.items():
        ours = heldout.training_config(train[name][0], [f"paths.log_dir={logs}", *train[name][1]])
        theirs = heldout.training_config(exp, [f"paths.log_dir={logs}", *over])
        assert ours == theirs, (name, heldout._differences(ours, theirs))
    # a finished scaling run (its saved config, an exported drafter) is what `finished` names
    run = tmp_path / "logs" / "train" / "scaling_medusa_1000000"
    (run / "drafter").mkdir(parents=True)
    (run / "drafter" / "config.json").write_text("{}")
    (run / ".hydra").mkdir()
    cfg = compose_config("train", ["+experiment=medusa_smollm2", f"paths.log_dir={logs}", *scaling])
    OmegaConf.set_struct(cfg, False)
    del cfg.data["aux_layers"]  # saved before the key existed (Falcon's model key: never Medusa's)
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    args = [sys.executable, "benchmarks/heldout.py", "finished", "--log-dir", logs]
    exp, argv = train["medusa"]
    found = subprocess.run([*args, exp, *argv], cwd=ROOT, capture_output=True, text=True)
    assert found.returncode == 0 and found.stdout.strip() == str(run), found.stderr
    other = subprocess.run([*args, exp, *argv, "optim.lr=0.5"], cwd=ROOT,
                           capture_output=True, text=True)  # fmt: skip
    assert other.returncode == 0 and other.stdout == ""
    # a run saved before a training key existed matches the key's old value, and only that
    falcon = tmp_path / "logs" / "train" / "scaling_falcon_1000000"
    (falcon / "drafter").mkdir(parents=True)
    (falcon / "drafter" / "config.json").write_text("{}")
    (falcon / ".hydra").mkdir()
    cfg = compose_config("train", ["+experiment=falcon_smollm2", f"paths.log_dir={logs}", *scaling])
    OmegaConf.set_struct(cfg, False)
    for (*parents, key), old in heldout.ADDED_SINCE.items():
        node = cfg
        for name in parents:
            node = node[name]
        # the default keeps what the old runs trained with
        assert OmegaConf.to_container(node, resolve=False)[key] == old
        del node[key]
    OmegaConf.save(cfg, falcon / ".hydra" / "config.yaml")
    exp, argv = train["falcon_k2"]
    found = subprocess.run([*args, exp, *argv], cwd=ROOT, capture_output=True, text=True)
    assert found.returncode == 0 and found.stdout.strip() == str(falcon), found.stderr
    other = subprocess.run([*args, exp, *argv, "drafter.csgd.own_pass_weight=0.5"], cwd=ROOT,
                           capture_output=True, text=True)  # fmt: skip
    assert other.returncode == 0 and other.stdout == "", other.stdout
