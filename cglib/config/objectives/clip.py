"""Declarations of the CLIP-style objectives: `loss: clip` and `loss: clip_hn` (cglib/train/objectives/clip.py,
clip_hn.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cglib.config.base import Section
from cglib.config.objectives.base import ObjectiveSpec


class ClipOptions(Section):
    """train.runs[i].options of a loss: clip run."""

    logit_scale: Literal["fixed", "learned"] | None = Field(
        None, description="fixed: logits = cos / tau (the run's tau); learned: the model's logit scale trained with "
        "the towers, clamped at ln 100 (the authors' ClipLoss fine-tuning); null = run.protocol's (corrected: "
        "fixed, as_published: learned).")
    hierarcaps_features: Literal["normalized", "raw"] | None = Field(
        None, description="The features of a run that fine-tunes the HierarCaps model (init chain reaching a loss: "
        "re run). normalized: unit norm, as every other run; raw: the towers' unnormalized outputs (the authors' "
        "train.py with their transformers CLIPModel); null = run.protocol's (corrected: normalized, as_published: "
        "raw). Other runs are always normalized.")


class ClipSpec(ObjectiveSpec):
    name, label, family = "clip", "CLIP InfoNCE", "clip"
    Options = ClipOptions


class ClipHardNegativesSpec(ObjectiveSpec):
    name, label, family = "clip_hn", "CLIP with keyword-permuted hard negatives", "clip"
    related = "keyword-permuted hard negatives (Rosch et al.)"
    permutes_keywords = True
