"""LightningDataModule over a distilled dataset, with online or offline target features.

Both feature modes yield identical batches (same examples, same order, same padding); offline
batches additionally carry `features` (B, T, d) read from the memory-mapped cache, online ones
get them from the target inside the training step.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

from drafters.data.corpus import load_distilled
from drafters.data.sharegpt import split_bucket, split_of
from drafters.models.vocab import token_counts
from drafters.target import Target
from drafters.training.checks import require_dataset
from drafters.training.examples import ConversationExamples, LengthBucketBatchSampler, collate
from drafters.training.feature_store import FeatureCache

FEATURE_MODES = ("online", "offline")


class _Collator:
    def __init__(self, examples: ConversationExamples, pad_id: int, cache: FeatureCache | None):
        self.examples, self.pad_id, self.cache = examples, pad_id, cache

    def __call__(self, indices: list[int]):
        exs = [self.examples[i] for i in indices]
        feats = ents = None
        if self.cache is not None:
            feats = [self.cache[e.key] for e in exs]
            ents = [self.cache.entropy(e.key) for e in exs]
            ents = None if any(h is None for h in ents) else ents
        return collate(exs, self.pad_id, feats, ents)


class DistilledDataModule(L.LightningDataModule):
    def __init__(
        self,
        dataset_dir: str,
        max_length: int = 1024,
        batch_size: int = 4,
        val_fraction: float = 0.05,
        features: str = "online",
        cache_dir: str | None = None,
        num_workers: int = 0,
        seed: int = 0,
        pool_batches: int = 64,
        distill_command: str = "python data/distill.py",
        max_train_tokens: int | None = None,
        aux_layers: list[int] | None = None,
    ):
        """aux_layers: target layers whose input hidden states offline batches carry beside f
        (wide features, `drafters.target.with_aux`), for a Falcon drafter in EAGLE-3's layout
        (its `drafter.model.aux_layers`, which the data config reads)."""
        super().__init__()
        if features not in FEATURE_MODES:
            raise ValueError(f"data.features={features!r}: use one of {FEATURE_MODES}")
        if features == "offline" and not cache_dir:
            raise ValueError("data.features=offline needs data.cache_dir")
        self.dataset_dir = dataset_dir
        self.max_length = max_length
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.features = features
        self.cache_dir = cache_dir
        self.num_workers = num_workers
        self.seed = seed
        self.pool_batches = pool_batches
        self.distill_command = distill_command
        if max_train_tokens is not None and int(max_train_tokens) <= 0:
            raise ValueError(
                f"data.max_train_tokens={max_train_tokens}: use a positive count or null"
            )
        self.max_train_tokens = None if max_train_tokens is None else int(max_train_tokens)
        self.aux_layers = tuple(int(i) for i in aux_layers) if aux_layers else None
        self.target: Target | None = None
        self.train_set: ConversationExamples | None = None
        self.val_set: ConversationExamples | None = None

    def attach(self, target: Target) -> DistilledDataModule:
        """The target whose tokenizer renders the examples (and whose identity guards caches)."""
        self.target = target
        return self

    def load_examples(self) -> tuple[ConversationExamples, ConversationExamples]:
        if self.target is None:
            raise RuntimeError("call datamodule.attach(target) before setup")
        require_dataset(self.dataset_dir, self.distill_command)
        ds, _ = load_distilled(self.dataset_dir, self.target.identity)
        rows = ds.to_list()
        # validation = held-out conversations (by id) of the distilled training split; a small
        # set whose ids all hash to train still gets its lowest-hash conversation held out
        val = [r for r in rows if split_of(r["id"], self.val_fraction) == "validation"]
        if not val and len(rows) > 1 and self.val_fraction > 0:
            val = [min(rows, key=lambda r: split_bucket(r["id"]))]
        val_ids = {r["id"] for r in val}
        train = [r for r in rows if r["id"] not in val_ids]
        if not train or not val:
            raise ValueError(
                f"{self.dataset_dir}: {len(rows)} conversations give {len(train)} train / "
                f"{len(val)} validation examples at data.val_fraction={self.val_fraction}; "
                "distil more conversations or change data.val_fraction"
            )
        tok, eos = self.target.tokenizer, self.target.eos_token_ids
        sets = (
            ConversationExamples(train, tok, self.max_length, eos),
            ConversationExamples(val, tok, self.max_length, eos),
        )
        for name, examples, rows_of in zip(
            ("train", "validation"), sets, (train, val), strict=True
        ):
            if len(examples) == 0:  # every answer starts past max_length: nothing to learn
                raise ValueError(
                    f"{self.dataset_dir}: no {name} example keeps an answer token within "
                    f"data.max_length={self.max_length} ({examples.dropped} of {len(rows_of)} "
                    "conversations dropped); raise data.max_length"
                )
        if self.max_train_tokens is not None:
            sets = (sets[0].subset_by_answer_tokens(self.max_train_tokens, self.seed), sets[1])
        return sets

    def token_counts(self, split: str = "train") -> torch.Tensor:
        """(V,) counts of the answer tokens (loss-masked: what the drafter learns to predict)
        of a split's examples; the draft vocabulary is built from the training split's."""
        self.setup()
        examples = self.train_set if split == "train" else self.val_set
        return token_counts(examples.answer_tokens(), self.target.vocab_size)

    def cache_folder(self, split: str) -> Path:
        return Path(self.cache_dir) / split

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is None:
            self.train_set, self.val_set = self.load_examples()

    def _loader(self, examples: ConversationExamples, split: str, train: bool) -> DataLoader:
        cache = None
        if self.features == "offline":
            cache = FeatureCache(self.cache_folder(split), self.target, examples, self.aux_layers)
        trainer = self.trainer
        rank = trainer.global_rank if trainer is not None else 0
        world = trainer.world_size if trainer is not None else 1
        sampler = LengthBucketBatchSampler(
            examples.lengths,
            self.batch_size,
            seed=self.seed,
            shuffle=train,
            rank=rank,
            world_size=world,
            pool_batches=self.pool_batches,
        )
        if train and trainer is not None:
            # Resume mid-epoch: skip the batches of this epoch that were already trained.
            sampler.set_epoch(trainer.current_epoch)
            sampler.start_batch = trainer.fit_loop.epoch_loop.batch_progress.current.completed
        pad = self.target.tokenizer.pad_token_id
        return DataLoader(
            list(range(len(examples))),
            batch_sampler=sampler,
            collate_fn=_Collator(examples, pad, cache),
            num_workers=self.num_workers,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, "train", train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, "validation", train=False)
