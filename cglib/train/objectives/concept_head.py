"""The concept head of the MCC objective (C3, `loss: mcc`): a concept's text embedding -> its conditioning vector.

h_g = 1 + W2 GELU(W1 t_g + b1) + b2, with t_g the concept name's unit embedding by the run's starting text tower
(computed once, `ConceptBank`) and W1 (L x H), W2 (H x L). W2 and b2 start at zero, so h_g starts at all ones
and MCC starts as a plain supervised contrastive loss in the joint space; the head learns which dimensions each
concept weighs. W1, b1 are initialized from the training seed (PyTorch's Linear default, under a forked RNG, so
the global RNG stream of the run is untouched). The head is a training-only module: its weights live in the
run's resume checkpoint (the Stepper's state) and in `<run>/training/<name>/mcc_head.safetensors`; the
evaluated model is the CLIP model alone. The concept of a group is its node's name: the n-gram for
`groups: ngram`, the l1 concept name for MAGIC groups (an evaluation query: such runs are marked exposed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn


class ConceptHead(nn.Module):
    """h = 1 + W2 GELU(W1 t + b1) + b2 (see the module docstring); (K, L) -> (K, L)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        nn.init.zeros_(self.net[2].weight)
        nn.init.zeros_(self.net[2].bias)

    def forward(self, concepts: Tensor) -> Tensor:
        return 1.0 + self.net(concepts)


def build_head(dim: int, hidden: int | None, seed: int) -> ConceptHead:
    """A ConceptHead initialized from `seed` without touching the global RNG (hidden None = dim)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ConceptHead(dim, hidden or dim)


@dataclass
class ConceptBank:
    """The frozen concept embeddings of the training groups: node id -> row of `table` (K, L)."""

    rows: dict[str, int]
    table: Tensor

    def __call__(self, groups: Sequence[str]) -> Tensor:
        """Rows of `groups` (node ids), in order; KeyError names an unknown group."""
        missing = [g for g in groups if g not in self.rows]
        if missing:
            raise KeyError(f"no concept embedding for groups {missing[:3]}: they are not training groups of this run")
        return self.table[torch.tensor([self.rows[g] for g in groups], device=self.table.device)]
