"""`loss: clip_hn`: CLIP with keyword-permuted hard negatives (Rösch et al.; `cglib.related`).

Each image's caption with one colour, object, size or location word swapped replaces one unmasked negative of
its image->text row (`cglib.losses.clip_hn_loss`); text->image is CLIP's. The replacements are planned for every
epoch when the phase starts (a pure function of seed, epoch and batch index, so resume and every DDP rank agree),
which also counts the pairs that had no keyword to permute (the summary's `hard_negatives`).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from cglib import losses
from cglib.config.objectives.clip import ClipHardNegativesSpec
from cglib.train.objectives.base import GroupFeatures, Objective, Setup
from cglib.train.objectives.keyword_negatives import HardNegativePlan, plan_hard_negatives


class ClipHardNegatives(ClipHardNegativesSpec, Objective):

    def __init__(self, spec: dict[str, Any], params: Any = None) -> None:
        super().__init__(spec, params)
        self.plan: HardNegativePlan | None = None

    def setup(self, setup: Setup) -> None:
        self.plan = plan_hard_negatives(setup.sampler, setup.inputs.keyword_permuter(), setup.seed, setup.epochs)

    def replacement_texts(self) -> set[str] | None:
        return self.plan.texts

    def pair_replacements(self) -> Any:
        return self.plan

    def forward(self, batch: GroupFeatures) -> dict[str, Tensor]:
        if batch.hard_text is None or batch.hard_columns is None:
            raise ValueError("loss clip_hn needs each pair's hard negative (hard_text, hard_columns); build the "
                             "batches with GroupBatchData(..., hard_negatives=objective.pair_replacements())")
        return {"loss": losses.clip_hn_loss(batch.image, batch.text, batch.hard_text, batch.hard_columns,
                                            tau=self.tau, text_ids=batch.text_ids)}

    def describe(self) -> dict[str, Any] | None:
        return None if self.plan is None else {"hard_negatives": self.plan.describe()}

    def announce(self) -> str:
        d = self.plan.describe()
        return f"; clip_hn: {d['pairs_without_keyword']} of {d['pairs']} pairs over all epochs have no keyword, so " \
               "no hard negative"
