"""Declaration of `loss: re`, HierarCaps' Radial Embedding alignment of the text tower alone
(cglib/train/objectives/radial_embedding.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from cglib.config.base import Section
from cglib.config.objectives.base import ObjectiveSpec, RunEntry, RunParams


class REOptions(Section):
    """train.runs[i].options of a loss: re run (HierarCaps' settings by default)."""

    data: Literal["magic", "hierarcaps_train"] = Field(
        "magic", description="The RE items. magic: built from this run's MAGIC train split (concept chain l_max..l1 "
        "+ a caption; the chain names are the l1-l4 evaluation queries, so the run is exposed to evaluation "
        "strings); hierarcaps_train: the authors' ~70k hierarchies (data.hierarcaps_train_csv).")
    epochs: int = Field(1, ge=1, description="Epochs over the RE items (HierarCaps: 1).")
    batch_size: int = Field(8, ge=1, description="RE items per batch (HierarCaps: 8).")
    lr: float = Field(1e-7, gt=0, description="Peak learning rate (HierarCaps' code: 1e-7).")
    w_mean: float = Field(1.0, ge=0, description="Weight of the mean term (paper: 1).")
    w_minimax: float = Field(1.0, ge=0, description="Weight of the mini-max term (paper: 1).")
    w_reg: float = Field(10.0, ge=0, description="Weight of the frozen-tower regularizer (paper: 10).")
    released: Path | None = Field(
        None, description="A file of the HierarCaps authors' released weights (a transformers CLIPModel state dict "
        "over openai/clip-vit-base-patch32; relative to the repo root). When it exists the row loads its text tower "
        "onto the base instead of training (summary weights_source: released); absent, the row is trained here and "
        "marked so.")


class RadialEmbeddingSpec(ObjectiveSpec):
    name, label, family = "re", "Radial Embedding alignment (HierarCaps)", "text"
    phase = "re"
    Options = REOptions
    distributed_refusal = "its text phase trains on one process"

    @classmethod
    def check_entry(cls, entry: RunEntry) -> None:
        super().check_entry(entry)
        if entry.pretrain != "none":
            raise ValueError(f"run {entry.name!r}: loss re trains the text tower on its own data and takes no textual "
                             "pretraining; set pretrain: none")
        if entry.groups == "ngram":
            raise ValueError(f"run {entry.name!r}: loss re trains on concept chains, not on group batches; remove "
                             "groups: ngram (or choose an image-text loss)")

    @classmethod
    def check(cls, params: RunParams, entry: RunEntry) -> None:
        """An RE run never draws group batches: train.groups_per_batch and pairs_per_group do not concern it."""

    @classmethod
    def exposure(cls, params: RunParams, entry: RunEntry) -> list[str]:
        if entry.options.data != "magic":
            return []
        return [("RE alignment on MAGIC concept chains: the l1-l4 concept names are its positives "
                 "(options.data: magic)")]

    @classmethod
    def input_files(cls, params: RunParams, entry: RunEntry) -> list[tuple[str, Path | None]]:
        if entry.options.data != "hierarcaps_train":
            return []
        return [("data.hierarcaps_train_csv", params.data.hierarcaps_train_csv)]
