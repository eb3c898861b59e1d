"""What CLEAR GLASS's group losses share: their options and where their unset values come from.

The pairwise (Eqs. 1-4), centroid (Eqs. 5-8) and memory-centroid objectives weigh an outer term (groups
against groups, temperature tau) and an inner term (pairs within a group, temperature tau') as
`(1 - alpha) * outer + alpha * inner`. tau' and alpha default to the params file's `train.tau_inner` and
`train.alpha` (what the search tunes); a run entry may set its own in `options`. `alpha_on` is one of the
differences between the paper and the authors' code (PAPER_NOTES.md): the printed equations weigh the inner
term by alpha, the authors' `loss.py` the outer one.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from cglib.config import Params, Section
from cglib.config.protocol import option_keys
from cglib.train.objectives.base import Objective


class GroupLossOptions(Section):
    """train.runs[i].options of a group-loss run (null = the train section's value)."""

    tau_inner: float | None = Field(None, gt=0, description="Inner temperature tau' (Eqs. 3, 7); null = "
                                    "train.tau_inner.")
    alpha: float | None = Field(None, ge=0.0, le=1.0, description="Weight of the inner term (Eqs. 4, 8); null = "
                                "train.alpha.")
    alpha_on: Literal["inner", "outer"] | None = Field(
        None, description="Which term alpha weighs: inner (the paper's Eqs. 4, 8) or outer (the authors' loss.py); "
        "null = run.protocol's (corrected: inner, as_published: outer).")


class GroupObjective(Objective):
    """Base of the group losses: `self.tau`, `self.tau_inner`, `self.alpha`, `self.alpha_on` are set."""

    family = "group"
    min_groups = 2
    Options = GroupLossOptions

    def __init__(self, spec: dict[str, Any], params: Params | None = None) -> None:
        super().__init__(spec, params)
        keys = ["tau_inner", "alpha", *option_keys(self.Options)]
        unset = [key for key in keys if getattr(self.options, key) is None]
        if unset:  # run_spec fills them from the train section and run.protocol; a hand-made spec must give them
            raise ValueError(f"the {self.name} objective needs options {', '.join(unset)}: give them in the "
                             "spec's options, or build it from run_spec (train and run.protocol fill them)")
        self.tau_inner, self.alpha, self.alpha_on = self.options.tau_inner, self.options.alpha, self.options.alpha_on

    @classmethod
    def resolve_options(cls, options: GroupLossOptions, params: Params) -> GroupLossOptions:
        filled = {key: getattr(params.train, key) for key in ("tau_inner", "alpha") if getattr(options, key) is None}
        return super().resolve_options(options, params).model_copy(update=filled)
