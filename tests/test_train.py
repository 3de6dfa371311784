"""Training end to end on the tiny target: every drafter, checkpoints, resume, feature modes."""

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from train_helpers import EAGLE3_AUX, ROOT, compose_config, tiny_overrides

from drafters.training.run import build_module, train

EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


def test_the_paper_and_embedded_experiments_exist():
    assert {
        "falcon_vicuna7b",
        "cerberus_vicuna7b",
        "medusa_vicuna7b",
        "falcon_llama2chat7b",
        "cerberus_llama2chat7b",
        "falcon_smollm2",
        "cerberus_smollm2",
        "medusa_smollm2",
    } <= set(EXPERIMENTS)
    for name in EXPERIMENTS:
        head = (ROOT / "conf" / "experiment" / f"{name}.yaml").read_text().splitlines()
        assert head[0] == "# @package _global_"
        assert any("Launch:" in line for line in head[:10]), name
        assert any("Prepare:" in line for line in head[:10]), name


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_instantiates(name, tmp_path, tiny, tiny_distilled):
    real = compose_config("train", [f"+experiment={name}"])
    assert real.run_name == name
    if "7b" in name:
        assert "deepspeed" in real.strategy._target_.lower() and real.strategy.stage == 2
        assert real.trainer.precision == "bf16-mixed"
    tiny_cfg = tiny_overrides(tmp_path, tiny_distilled)
    cfg = compose_config("train", [f"+experiment={name}"] + tiny_cfg)
    dm = instantiate(cfg.data).attach(tiny)
    module = build_module(cfg, tiny)
    trainer = instantiate(cfg.trainer)
    assert module.kind == real.drafter.kind and dm.batch_size == 4 and trainer.max_steps == 3


@pytest.mark.parametrize("drafter", ["falcon", "cerberus", "medusa"])
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])  # auto takes bf16 on some CPUs
def test_short_run_of_each_drafter(drafter, precision, tmp_path, tiny_distilled):
    over = tiny_overrides(tmp_path, tiny_distilled, f"drafter={drafter}")
    over[over.index("trainer.precision=32-true")] = f"trainer.precision={precision}"
    cfg = compose_config("train", over)
    metrics = train(cfg)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())
    assert metrics["train/loss"] > 0 and "val/loss" in metrics
    assert 1.0 <= metrics["val/accept_len_est"]
    key = "val/acc_pos1" if drafter == "falcon" else "val/acc_head0"
    assert 0.0 <= metrics[key] <= 1.0
    if drafter == "falcon":
        assert "val/acc_pass2" in metrics and "train/glance_ratio" in metrics
    if drafter == "cerberus":
        assert "val/gate_calib" in metrics
    csv = Path(cfg.run_dir) / "csv" / "metrics.csv"
    assert "train/tokens_per_s" in csv.read_text().splitlines()[0]


def test_checkpoint_is_drafter_only_and_resumes_step_and_lambda(tmp_path, tiny, tiny_distilled):
    def overrides(*extra):
        return tiny_overrides(
            tmp_path,
            tiny_distilled,
            "trainer.max_epochs=3",
            "callbacks.checkpoint.every_n_train_steps=2",
            *extra,
        )

    cfg = compose_config("train", overrides("trainer.max_steps=4"))
    train(cfg)
    last = Path(cfg.run_dir) / "checkpoints" / "last.ckpt"
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["global_step"] == 4
    keys = list(ckpt["state_dict"])
    assert keys and all(k.startswith("drafter.") for k in keys)
    vocab_rows = [k for k, v in ckpt["state_dict"].items() if v.shape[:1] == (tiny.vocab_size,)]
    assert vocab_rows == []  # neither the target's embedding nor its LM head
    assert ckpt["hyper_parameters"]["target"]["tokenizer_hash"] == tiny.identity.tokenizer_hash

    # resume the same run to a later step: same step count, same λ schedule position
    cfg2 = compose_config("train", overrides("trainer.max_steps=6", "ckpt_path=last"))
    metrics = train(cfg2)
    ckpt2 = torch.load(last, weights_only=True)
    assert ckpt2["global_step"] == 6
    rows = (Path(cfg.run_dir) / "csv" / "metrics.csv").read_text().splitlines()
    steps = {int(r.split(",")[rows[0].split(",").index("step")]) for r in rows[1:]}
    assert {0, 5} <= steps  # the restart appended to the first start's metrics
    fresh = compose_config(
        "train",
        tiny_overrides(
            tmp_path / "b", tiny_distilled, "trainer.max_steps=6", "trainer.max_epochs=3"
        ),
    )
    ref = train(fresh)
    assert metrics["train/csgd_lambda"] == pytest.approx(ref["train/csgd_lambda"])
    # and the lr schedule too, though LambdaLR's restored state carries the 4-step run's sizes
    assert metrics["train/lr"] == pytest.approx(ref["train/lr"])


def test_resume_continues_the_same_data_order(tmp_path, tiny, tiny_distilled):
    seen = {}

    def record(tag, over):
        cfg = compose_config("train", over)
        from drafters.training import module as M

        orig = M.DrafterLitModule.training_step

        def spy(self, batch, idx):
            seen.setdefault(tag, []).append(batch["input_ids"][:, :8].clone())
            return orig(self, batch, idx)

        M.DrafterLitModule.training_step = spy
        try:
            train(cfg)
        finally:
            M.DrafterLitModule.training_step = orig

    base = tiny_overrides(
        tmp_path,
        tiny_distilled,
        "callbacks.checkpoint.every_n_train_steps=2",
        "trainer.max_epochs=3",
        "trainer.max_steps=-1",
    )
    record("whole", base)
    cut = tiny_overrides(
        tmp_path / "cut",
        tiny_distilled,
        "callbacks.checkpoint.every_n_train_steps=2",
        "trainer.max_epochs=3",
    )
    record("first", cut + ["trainer.max_steps=4"])
    record("rest", cut + ["trainer.max_steps=-1", "ckpt_path=last"])
    resumed = seen["first"] + seen["rest"]
    assert len(resumed) == len(seen["whole"])
    assert all(torch.equal(a, b) for a, b in zip(resumed, seen["whole"], strict=True))


@pytest.mark.parametrize("extra", [(), EAGLE3_AUX], ids=["default", "eagle3_aux"])
def test_online_and_offline_features_give_the_same_loss(tmp_path, tiny, tiny_distilled, extra):
    """The same loss from a target forward in the step and from the cache (eagle3_aux: the
    data config reads the drafter's aux layers, so the cache carries them)."""
    from drafters.training.feature_cache import build_feature_cache

    cfg = compose_config("train", tiny_overrides(tmp_path, tiny_distilled, *extra))
    online = instantiate(cfg.data).attach(tiny)
    online.setup()
    assert online.aux_layers == ((1,) if extra else None)
    build_feature_cache(tiny, online.train_set, Path(cfg.data.cache_dir) / "train", "float32",
                        aux_layers=online.aux_layers)  # fmt: skip
    cfg_off = compose_config(
        "train", tiny_overrides(tmp_path, tiny_distilled, "data.features=offline", *extra)
    )
    offline = instantiate(cfg_off.data).attach(tiny)
    offline.setup()
    module = build_module(cfg, tiny)
    b_on, b_off = next(iter(online.train_dataloader())), next(iter(offline.train_dataloader()))
    assert "features" in b_off and "features" not in b_on
    torch.manual_seed(0)
    loss_on, _, _ = module.compute_loss(b_on, train=False)
    torch.manual_seed(0)
    loss_off, _, _ = module.compute_loss(b_off, train=False)
    torch.testing.assert_close(loss_on, loss_off, atol=1e-5, rtol=1e-5)


def test_eagle3_aux_run_exports_and_decodes_losslessly(tmp_path, tiny, tiny_distilled):
    """A short run of the EAGLE-3 layout with fused features (online), then its export loads
    with the aux layers and decodes plain greedy's tokens."""
    from drafters.decoding.falcon import decode_falcon
    from drafters.export import load_drafter

    cfg = compose_config("train", tiny_overrides(tmp_path, tiny_distilled, *EAGLE3_AUX))
    metrics = train(cfg)
    assert torch.isfinite(torch.tensor(metrics["val/loss"]))
    loaded = load_drafter(Path(cfg.run_dir) / "drafter")
    assert loaded.model.cfg.aux_layers == (1,) and loaded.model.fc is not None
    ids = torch.tensor([tiny.tokenizer.encode("hello there")])
    ref = tiny.model.generate(ids, max_new_tokens=20, do_sample=False)
    out = decode_falcon(tiny, loaded.model, ids, 20, tree="chain")
    assert torch.equal(out.sequences, ref[:, : out.sequences.shape[1]])


def test_last_checkpoint_holds_the_final_step(tmp_path, tiny_distilled):
    """max_steps not a multiple of the checkpoint period: last.ckpt still ends at max_steps."""
    over = tiny_overrides(tmp_path, tiny_distilled, "trainer.max_steps=3",
                          "callbacks.checkpoint.every_n_train_steps=2")  # fmt: skip
    cfg = compose_config("train", over)
    train(cfg)
    last = torch.load(Path(cfg.run_dir) / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 3
