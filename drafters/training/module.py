"""DrafterLitModule: trains any drafter (Falcon, Cerberus, Medusa) against the frozen target.

The target is attached, not owned: `drafters.target.Target` is not an nn.Module, so its weights
never enter `state_dict()`, the optimizer or a checkpoint. Hyper-parameters are primitives only
(`torch.load(ckpt, weights_only=True)` works). Metrics: `train/...` and `val/...`.
"""

from __future__ import annotations

import math
import time

import lightning as L
import torch

from drafters.losses import csgd_lambda, csgd_step, heads_loss
from drafters.losses.heads import head_labels
from drafters.models import (
    HEAD_KINDS,
    EntropyGate,
    LearnedGate,
    LearnedGateConfig,
    build_drafter,
)
from drafters.models.vocab import top_ids
from drafters.target import Target
from drafters.training.feature_cache import target_entropy

FALCON_DECODE_PASSES = 4  # drafter passes per step assumed by val/accept_len_est (paper: m=4)


class WarmupDecay:
    """lr multiplier: linear warmup, then cosine/linear decay to min_ratio, or constant."""

    def __init__(self, warmup: int, total: int, schedule: str, min_ratio: float):
        if schedule not in ("cosine", "linear", "constant"):
            raise ValueError(f"optim.schedule={schedule!r}: use cosine, linear or constant")
        self.warmup, self.total = warmup, max(total, 1)
        self.schedule, self.min_ratio = schedule, min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if self.schedule == "constant":
            return 1.0
        p = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        shape = 0.5 * (1 + math.cos(math.pi * p)) if self.schedule == "cosine" else 1 - p
        return self.min_ratio + (1 - self.min_ratio) * shape


def accept_len_estimate(acc: list[float]) -> float:
    """Chain acceptance with the bonus token: 1 + sum_i prod_{j<=i} acc_j (acc per offset)."""
    total, run = 1.0, 1.0
    for a in acc:
        run *= a
        total += run
    return total


def falcon_chain_rates(metrics, k: int, passes: int) -> list[float]:
    """Per-depth rates of a top-1 chain of FALCON_DECODE_PASSES passes from validation metrics:
    the decode-faithful `val/acc_depth{d}` (d = 1 .. k * passes, each given the depths before it
    right), deeper depths repeating the last measured pass; without them (LSTM fusion), the
    teacher-forced `val/acc_pos{p}` then the paper's `val/acc_pass2_pos{p}` for later passes."""
    total = k * FALCON_DECODE_PASSES
    if "val/acc_depth1" in metrics:
        acc = [float(metrics[f"val/acc_depth{d}"]) for d in range(1, k * passes + 1)]
        last = acc[-k:]
    else:
        acc = [float(metrics.get(f"val/acc_pos{p}", 0.0)) for p in range(1, k + 1)]
        last = [float(metrics.get(f"val/acc_pass2_pos{p}", 0.0)) for p in range(1, k + 1)]
    while len(acc) < total:
        acc += last
    return acc[:total]


class DrafterLitModule(L.LightningModule):
    def __init__(
        self,
        kind: str,
        model: dict,
        loss: dict | None = None,
        optim: dict | None = None,
        csgd: dict | None = None,
        gate: str | None = None,
        gate_hidden_dim: int = 256,
        target: dict | None = None,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.kind = kind
        self.drafter = build_drafter(kind, model)
        self.loss_cfg = dict(loss or {})
        self.optim_cfg = dict(optim or {})
        self.csgd_cfg = dict(csgd or {})
        self.gate = None
        self.entropy_gate = None
        if kind in HEAD_KINDS:
            k = self.drafter.num_heads
            # Always calibrated on validation (a buffer table): lets the decoder use the entropy
            # gate with any head drafter. The learned gate is trained only when asked for.
            self.entropy_gate = EntropyGate(num_heads=k)
            if gate == "learned":
                self.gate = LearnedGate(LearnedGateConfig(model["hidden_size"], k, gate_hidden_dim))
        elif gate is not None:
            raise ValueError(f"drafter.gate={gate!r}: only head drafters (medusa, cerberus) gate")
        self.target: Target | None = None
        self._calib: list[torch.Tensor] = []
        self._t_last: float | None = None
        self._last_tokens = 0
        self._window = [0, 0.0]  # tokens, seconds of the iterations since the last log

    # ---- the frozen target ------------------------------------------------------------------

    def attach(self, target: Target) -> DrafterLitModule:
        identity = self.hparams.get("target")
        if identity is not None:
            problem = target.identity.mismatch(identity, "this drafter")
            if problem:
                raise ValueError(problem)
        self.target = target
        return self

    def init_draft_vocab(self, counts: torch.Tensor) -> torch.Tensor | None:
        """Set the drafter's draft vocabulary to the most frequent ids of `counts` (V,), the
        training answers' token counts (docs/design.md section 10); a no-op without one. A
        resumed run then restores the checkpoint's own ids with the state dict."""
        vocab = self.drafter.vocab
        if vocab is None:
            return None
        vocab.set_ids(top_ids(counts, vocab.size))
        return vocab.ids

    def on_fit_start(self) -> None:
        self.target.to(self.device)
        if getattr(self.drafter, "lm_head", None) is not None and self.trainer.global_step == 0:
            self.drafter.load_lm_head(self.target.lm_head.weight.detach().to(self.device))

    def on_validation_start(self) -> None:
        self.target.to(self.device)

    @property
    def aux_layers(self) -> tuple[int, ...] | None:
        """Target layers a Falcon drafter in EAGLE-3's layout fuses (FalconConfig.aux_layers)."""
        return getattr(getattr(self.drafter, "cfg", None), "aux_layers", None)

    def features(self, batch: dict) -> torch.Tensor:
        """f (B, T, d), wide with aux_layers (`drafters.target.with_aux`): from the offline cache
        when the batch carries it, else a target forward."""
        if "features" in batch:
            f = batch["features"]
            want = self.target.hidden_size * (1 + len(self.aux_layers or ()))
            if f.shape[-1] != want:
                raise ValueError(
                    f"batch features are {f.shape[-1]} wide, the drafter reads {want} (f and "
                    f"aux_layers={self.aux_layers}); build the cache with the same "
                    "drafter.model.aux_layers (`python data/cache_features.py` + this run's "
                    "overrides)"
                )
            return f.to(self.target.dtype)
        f, _ = self.target.features(
            batch["input_ids"], batch["attention_mask"], aux_layers=self.aux_layers
        )
        return f

    # ---- losses -----------------------------------------------------------------------------

    def logging_step(self) -> bool:
        """Whether this training step's metrics reach the loggers (Lightning's own rule); the
        accuracy metrics (an argmax over the vocabulary per row) are computed on those only."""
        if self._trainer is None:
            return True
        return bool(self.trainer._logger_connector.should_update_logs)

    def compute_loss(self, batch: dict, train: bool) -> tuple[torch.Tensor, dict, torch.Tensor]:
        f = self.features(batch)
        ids, attn, lmask = batch["input_ids"], batch["attention_mask"], batch["loss_mask"]
        param_dtype = next(self.drafter.parameters()).dtype
        accuracy = not train or self.logging_step()
        vocab = self.drafter.vocab
        head = self.drafter.scoring_head(self.target.lm_head)  # V_d rows with a draft vocab
        if self.kind == "falcon":
            c = self.csgd_cfg
            lam = self.csgd_lambda() if train else 0.0
            loss, m = csgd_step(
                self.drafter,
                f.to(param_dtype),
                ids,
                attn,
                lmask,
                self.target.embed_tokens,
                head,
                self.drafter.cfg.k,
                lam,
                # validation measures every variant the same way, so ablations compare fairly
                teacher_forcing_only=bool(c.get("teacher_forcing_only")) and train,
                loss_on_glanced=bool(c.get("loss_on_glanced", True)),
                noise=float(self.loss_cfg.get("feature_noise", 0.0)) if train else 0.0,
                vocab=vocab,
                accuracy=accuracy,
                variant=c.get("variant", "decode") if train else self.measured_variant(),
                passes=int(c.get("passes", 2)),
                own_pass_weight=float(c.get("own_pass_weight", 1.0)),
            )
            m["csgd_lambda"] = torch.tensor(lam)
            return loss, m, f[..., : self.target.hidden_size]
        hidden = self.drafter.hidden(f.to(param_dtype))  # (B, T, K, d); logits per labelled row
        K = hidden.shape[2]
        gate_logits = None
        if self.gate is not None:
            # the gate reads H(p_t) of the target's full distribution, at the rows it is
            # trained on only (some head labelled); the rest never enter the loss
            _, valid = head_labels(ids, lmask, K)
            h = self.target_entropy(batch, f, valid.any(-1))
            gate_logits = self.gate(f.to(param_dtype), target_entropy=h)
        loss, m, correct = heads_loss(
            hidden,
            ids,
            lmask,
            float(self.loss_cfg.get("decay", 0.8)),
            gate_logits,
            head=head,
            vocab=vocab,
            accuracy=accuracy,
            return_correct=True,
        )
        if not train:  # entropy-gate calibration pairs: (H(p_t), top-1 chain accepted length)
            _, valid = head_labels(ids, lmask, K)
            full = valid.all(-1)
            acc_len = correct.long().cumprod(-1).sum(-1)
            h = self.target_entropy(batch, f, full)
            self._calib.append(torch.stack([h[full], acc_len[full].float()]).cpu())
        return loss, m, f

    def measured_variant(self) -> str:
        """The CSGD variant validation measures: decode-faithful passes (own blocks over true
        context, `val/acc_depth{d}`) for every drafter without a recurrent fusion whatever it
        trains with; the paper's all-own pass 2 for LSTM fusion, which the decode variant cannot
        run."""
        return "paper" if self.drafter.cfg.fusion == "lstm" else "decode"

    @torch.no_grad()
    def target_entropy(self, batch: dict, f: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """(B, T) entropy of the target's next-token distribution at `rows` (B, T) bool, 0
        elsewhere: read from the offline cache when it holds it, else from the target's full LM
        head at those rows only."""
        if "target_entropy" in batch:
            return batch["target_entropy"].to(f.device).masked_fill(~rows, 0.0)
        h = torch.zeros(rows.shape, dtype=torch.float32, device=f.device)
        h[rows] = target_entropy(self.target, f[rows])
        return h

    def csgd_lambda(self) -> float:
        c = self.csgd_cfg
        total = max(1, self.trainer.estimated_stepping_batches) if self._trainer else 1
        return csgd_lambda(
            self.global_step / total, c.get("lambda_start", 0.4), c.get("lambda_end", 0.0)
        )

    # ---- steps --------------------------------------------------------------------------------

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, metrics, _ = self.compute_loss(batch, train=True)
        self.log("train/loss", loss, prog_bar=True)
        self.log_dict({f"train/{k}": v for k, v in metrics.items()})
        self._log_throughput(int(batch["attention_mask"].sum()))
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        return loss

    def _log_throughput(self, tokens: int) -> None:
        """train/tokens_per_s: all tokens of a batch (prompt and answer) per second of whole
        training iterations (forward, backward, optimizer, data), averaged over the iterations
        since the last logging step, so steps that skip the accuracy metrics count too."""
        now = time.perf_counter()
        if self._t_last is not None:
            self._window[0] += self._last_tokens
            self._window[1] += now - self._t_last
        self._t_last, self._last_tokens = now, tokens
        if self._window[1] > 0 and self.logging_step():
            self.log("train/tokens_per_s", self._window[0] / self._window[1], prog_bar=True)
            self._window = [0, 0.0]

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        loss, metrics, _ = self.compute_loss(batch, train=False)
        n = int(batch["loss_mask"].sum())
        self.log("val/loss", loss, prog_bar=True, batch_size=n, sync_dist=True)
        self.log_dict({f"val/{k}": v for k, v in metrics.items()}, batch_size=n, sync_dist=True)

    def on_validation_epoch_start(self) -> None:
        self._calib = []
        self._t_last = None  # the validation pass is not a training iteration

    def on_validation_epoch_end(self) -> None:
        m = self.trainer.callback_metrics
        if self.kind == "falcon":
            acc = falcon_chain_rates(m, self.drafter.cfg.k, int(self.csgd_cfg.get("passes", 2)))
        else:
            acc = [float(m.get(f"val/acc_head{i}", 0.0)) for i in range(self.drafter.num_heads)]
        self.log("val/accept_len_est", accept_len_estimate(acc), sync_dist=True)
        if self.entropy_gate is not None and self._calib:
            h, a = torch.cat(self._calib, dim=1)
            self.entropy_gate.fit(h.to(self.device), a.to(self.device))
        self._calib = []

    def on_train_epoch_start(self) -> None:
        self._t_last = None

    # ---- optimizer ----------------------------------------------------------------------------

    def configure_optimizers(self):
        o = self.optim_cfg
        params = [p for p in self.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(
            params,
            lr=float(o.get("lr", 1e-3)),
            betas=tuple(o.get("betas", (0.9, 0.95))),
            weight_decay=float(o.get("weight_decay", 0.0)),
        )
        warmup, total = self._schedule_steps()
        schedule = WarmupDecay(
            warmup, total, o.get("schedule", "cosine"), float(o.get("min_lr_ratio", 0.1))
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def _schedule_steps(self) -> tuple[int, int]:
        """(warmup, total) optimizer steps of this run's lr schedule."""
        o = self.optim_cfg
        total = int(self.trainer.estimated_stepping_batches)
        warmup = o.get("warmup_steps")
        if warmup is None:  # sized by the run: a share of its optimizer steps
            warmup = math.ceil(float(o.get("warmup_ratio", 0.0)) * total)
        return int(warmup), total

    def on_train_start(self) -> None:
        """A resumed run restores LambdaLR's state, and with it the schedule's sizes from the
        run that saved the checkpoint; a resume with another step budget (a raised
        trainer.max_steps) would then keep decaying over the old one while CSGD's λ follows the
        new one. Size the schedule by this run, and say so when that changes it."""
        sched = self.lr_schedulers()
        fn = sched.lr_lambdas[0] if sched is not None else None
        if not isinstance(fn, WarmupDecay):
            return
        mine = WarmupDecay(*self._schedule_steps(), fn.schedule, fn.min_ratio)
        if (mine.warmup, mine.total) != (fn.warmup, fn.total):
            if self.global_rank == 0:
                print(f"[train] lr schedule sized by this run: {mine.total} steps, warmup "
                      f"{mine.warmup} (the checkpoint's run: {fn.total}, {fn.warmup})")  # fmt: skip
            sched.lr_lambdas[0] = mine
