"""The training objectives as params validation sees them: one torch-free declaration per built-in objective (its
name, family, options model, the checks that read only params) and where its `nn.Module` lives.

    objective_spec("centroid")          # CentroidSpec: validating a params file imports no torch
    trained_by(CentroidSpec)            # cglib.train.objectives.centroid.Centroid, imported only now

`loss: package.module:ClassName` names an outside objective: a subclass of `cglib.train.objectives.Objective`, so its
own declaration. Validating a file that names one imports it, through the training layer's loader (named below, not
imported: a file of built-in objectives never loads torch).
"""

from __future__ import annotations

import difflib

from cglib.config.objectives.base import FAMILIES, NoOptions, ObjectiveSpec, entry_option
from cglib.config.objectives.clip import ClipHardNegativesSpec, ClipSpec
from cglib.config.objectives.group_losses import CentroidSpec, MemoryCentroidSpec, PairwiseSpec
from cglib.config.objectives.mcc import MCCSpec
from cglib.config.objectives.radial_embedding import RadialEmbeddingSpec
from cglib.plugins import named

__all__ = ["FAMILIES", "IMPLEMENTATIONS", "OBJECTIVE_SPECS", "NoOptions", "ObjectiveSpec", "entry_option",
           "objective_spec", "trained_by"]

# the built-in objectives, by the name a run entry's `loss` gives (the paper's rows first, then related methods)
OBJECTIVE_SPECS: dict[str, type[ObjectiveSpec]] = {spec.name: spec for spec in (
    ClipSpec, PairwiseSpec, CentroidSpec, RadialEmbeddingSpec, ClipHardNegativesSpec, MemoryCentroidSpec, MCCSpec)}

# where each one's nn.Module lives (it subclasses the declaration above)
IMPLEMENTATIONS: dict[str, str] = {
    "clip": "cglib.train.objectives.clip:Clip",
    "pairwise": "cglib.train.objectives.pairwise:Pairwise",
    "centroid": "cglib.train.objectives.centroid:Centroid",
    "re": "cglib.train.objectives.radial_embedding:RadialEmbedding",
    "clip_hn": "cglib.train.objectives.clip_hn:ClipHardNegatives",
    "memory_centroid": "cglib.train.objectives.memory_centroid:MemoryCentroid",
    "mcc": "cglib.train.objectives.mcc:MCC",
}

# what checks an outside objective: the training layer's loader (a subclass of Objective, a known family)
OUTSIDE_OBJECTIVE_LOADER = "cglib.train.objectives:objective_class"


def objective_spec(loss: str) -> type[ObjectiveSpec]:
    """The declaration a `loss` names: a built-in one, or an outside `package.module:ClassName` (imported)."""
    if loss in OBJECTIVE_SPECS:
        return OBJECTIVE_SPECS[loss]
    if ":" not in loss:  # not a package.module:ClassName path: a misspelt built-in name
        close = difflib.get_close_matches(loss, list(OBJECTIVE_SPECS), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ValueError(f"unknown loss {loss!r}; {hint}use one of {', '.join(OBJECTIVE_SPECS)} or your own "
                         "objective as package.module:ClassName")
    return named(OUTSIDE_OBJECTIVE_LOADER)(loss)


def trained_by(spec: type[ObjectiveSpec]) -> type:
    """The nn.Module class that trains `spec`'s runs: a built-in declaration's implementation (imported now, with
    torch), or the class itself (an outside objective, or an implementation)."""
    if OBJECTIVE_SPECS.get(spec.name) is not spec:
        return spec
    return named(IMPLEMENTATIONS[spec.name])
