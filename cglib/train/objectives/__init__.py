"""Training objectives: one module each, one registry, one way to plug in your own.

    from cglib.train.objectives import build_objective, objective_class
    objective = build_objective(params, entry, spec)      # what train.runs[i].loss names, ready to set up
    objective = objective_with("centroid", tau=0.1, tau_inner=0.1, alpha=0.7)   # outside a run (figures, notebooks)

`train.runs[i].loss` is a built-in name (`OBJECTIVES` below) or `package.module:ClassName`, a subclass of
`Objective` defined anywhere importable (see base.py for the contract and a ten-line example). What params
validation reads of a built-in one (name, family, Options, the params checks) is its torch-free declaration in
cglib/config/objectives/, which its class here subclasses. The training loop, the checkpoint, the run summary,
Table 3's roles and the figures ask the objective (its family, label, hooks), never its name, so a new objective
is one file (and its declaration).
"""

from __future__ import annotations

from typing import Any

from cglib.config.objectives import objective_spec, trained_by
from cglib.config.protocol import protocol_options
from cglib.plugins import load_plugin
from cglib.train.objectives.base import FAMILIES, GroupFeatures, Objective, Setup
from cglib.train.objectives.centroid import Centroid
from cglib.train.objectives.clip import Clip
from cglib.train.objectives.clip_hn import ClipHardNegatives
from cglib.train.objectives.mcc import MCC
from cglib.train.objectives.memory_centroid import MemoryCentroid
from cglib.train.objectives.pairwise import Pairwise
from cglib.train.objectives.radial_embedding import RadialEmbedding
from cglib.train.objectives.text_alignment import TextAlignment

__all__ = ["FAMILIES", "MCC", "OBJECTIVES", "Centroid", "Clip", "ClipHardNegatives", "GroupFeatures",
           "MemoryCentroid", "Objective", "Pairwise", "RadialEmbedding", "Setup", "TextAlignment", "build_objective",
           "objective_class", "objective_for", "objective_with"]

# the built-in objectives, by the name a run entry's `loss` gives (the paper's rows first, then related methods)
OBJECTIVES: dict[str, type[Objective]] = {cls.name: cls for cls in (
    Clip, Pairwise, Centroid, RadialEmbedding, ClipHardNegatives, MemoryCentroid, MCC)}


def objective_class(loss: str) -> type[Objective]:
    """The objective class a `loss` names: a built-in name or `package.module:ClassName` (imported)."""
    if loss in OBJECTIVES:
        return OBJECTIVES[loss]
    if ":" not in loss:  # a misspelt built-in name: the declarations' registry says which it may be
        return trained_by(objective_spec(loss))
    cls = load_plugin(loss, Objective, "loss", "define it as `class MyObjective(Objective)` with a forward(batch)")
    if cls.family not in FAMILIES:
        raise ValueError(f"loss {loss!r}: family {cls.family!r} is not one of {', '.join(FAMILIES)}; set the class "
                         "attribute `family`")
    return cls


def objective_for(entry: Any) -> type[Objective]:
    """The objective class of a run entry (a centroid run with options.memory_momentum is the memory variant)."""
    return entry.objective()


def build_objective(params: Any, entry: Any, spec: dict[str, Any]) -> Objective:
    """The run entry's objective, built from its spec (`run_spec(...)["run"]`) and the params."""
    return objective_for(entry)(spec, params)


def objective_with(loss: str, tau: float, protocol: str = "corrected", **settings: Any) -> Objective:
    """An objective outside a run (figures, benchmarks, notebooks) from shared settings: each objective takes the
    settings its Options declare (a group loss tau_inner, alpha, alpha_on; clip none of them); the protocol keys
    it is not given take `protocol`'s values (run.protocol)."""
    cls = objective_class(loss)
    options = cls.Options.model_validate({k: v for k, v in settings.items() if k in cls.Options.model_fields})
    return cls({"tau": tau, "options": {**options.model_dump(), **protocol_options(options, protocol)}})
