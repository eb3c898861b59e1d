"""What CLEAR GLASS's group losses share: their options and where their unset values come from.

The pairwise (Eqs. 1-4), centroid (Eqs. 5-8) and memory-centroid objectives weigh an outer term (groups
against groups, temperature tau) and an inner term (pairs within a group, temperature tau') as
`(1 - alpha) * outer + alpha * inner`. tau' and alpha default to the params file's `train.tau_inner` and
`train.alpha` (what the search tunes); a run entry may set its own in `options`. `alpha_on` is one of the
differences between the paper and the authors' code (PAPER_NOTES.md): the printed equations weigh the inner
term by alpha, the authors' `loss.py` the outer one.
"""

from __future__ import annotations

from typing import Any

from cglib.config import Params
from cglib.config.objectives.group_losses import GroupLossOptions, GroupLossSpec
from cglib.config.protocol import option_keys
from cglib.train.objectives.base import Objective

__all__ = ["GroupLossOptions", "GroupObjective"]


class GroupObjective(GroupLossSpec, Objective):
    """Base of the group losses: `self.tau`, `self.tau_inner`, `self.alpha`, `self.alpha_on` are set."""

    def __init__(self, spec: dict[str, Any], params: Params | None = None) -> None:
        super().__init__(spec, params)
        keys = ["tau_inner", "alpha", *option_keys(self.Options)]
        unset = [key for key in keys if getattr(self.options, key) is None]
        if unset:  # run_spec fills them from the train section and run.protocol; a hand-made spec must give them
            raise ValueError(f"the {self.name} objective needs options {', '.join(unset)}: give them in the "
                             "spec's options, or build it from run_spec (train and run.protocol fill them)")
        self.tau_inner, self.alpha, self.alpha_on = self.options.tau_inner, self.options.alpha, self.options.alpha_on
