"""`loss: re`: the HierarCaps baseline, Radial Embedding alignment of the text tower alone (`cglib.radial`).

A text objective: its runs have no image-text phase. The RE phase (cglib/train/re_run.py: items, batches) embeds
each batch's texts with the trainable text side and calls this objective with them; the regularizer compares
them with the starting tower's embeddings, which the phase computes once and hands over (`reference`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from cglib.train.objectives.base import Objective
from cglib.train.re_run import re_step_loss

RE_KEYS = ("re_data", "re_epochs", "re_batch_size", "re_lr", "re_w_mean", "re_w_minimax", "re_w_reg")


class RadialEmbedding(Objective):
    name, label, family = "re", "Radial Embedding alignment (HierarCaps)", "text"
    phase = "re"
    train_keys = RE_KEYS
    run_keys = ("released",)
    distributed_refusal = "its text phase trains on one process"

    def __init__(self, spec: dict[str, Any], params: Any = None) -> None:
        super().__init__(spec, params)
        t = params.train
        self.weights = {"w_mean": t.re_w_mean, "w_minimax": t.re_w_minimax, "w_reg": t.re_w_reg}
        self.frozen: Tensor | None = None
        self.rows: dict[str, int] = {}

    @classmethod
    def check_entry(cls, entry: Any) -> None:
        super().check_entry(entry)
        if entry.pretrain != "none":
            raise ValueError(f"run {entry.name!r}: loss re trains the text tower on its own data and takes no textual "
                             "pretraining; set pretrain: none")
        if entry.groups == "ngram":
            raise ValueError(f"run {entry.name!r}: loss re trains on concept chains, not on group batches; remove "
                             "groups: ngram (or choose an image-text loss)")

    @classmethod
    def check(cls, params: Any, entry: Any) -> None:
        """An RE run never draws group batches: train.groups_per_batch and pairs_per_group do not concern it."""

    @classmethod
    def exposure(cls, params: Any, entry: Any) -> list[str]:
        if params.train.re_data != "magic":
            return []
        return [("RE alignment on MAGIC concept chains: the l1-l4 concept names are its positives "
                 "(train.re_data: magic)")]

    def reference(self, frozen: Tensor, rows: dict[str, int]) -> None:
        """The starting tower's embedding `frozen[rows[text]]` of every text the phase can meet (the regularizer)."""
        self.frozen, self.rows = frozen, rows

    def forward(self, embed: Callable[[list[str]], torch.Tensor], batch: list) -> dict[str, Tensor]:
        return re_step_loss(embed, batch, self.frozen, self.rows, self.weights)
