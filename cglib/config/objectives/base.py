"""What params validation needs from a training objective, without torch: its name, family, options model and the
checks that read only the params file.

Every objective's `nn.Module` (cglib/train/objectives/) subclasses its declaration here, so the two cannot disagree:
`class Clip(ClipSpec, Objective)`. An outside objective (`loss: package.module:Class`) subclasses `Objective`, which
subclasses `ObjectiveSpec`, so it is its own declaration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Protocol

from cglib.config.base import Section
from cglib.config.protocol import protocol_options


class RunEntry(Protocol):
    """What a declaration reads of a run entry (`cglib.config.training.TrainRunParams`, which imports this module:
    a Protocol keeps the params layer free of a cycle)."""

    name: str
    groups: str
    pretrain: Any
    options: Any


class RunParams(Protocol):
    """What a declaration reads of a params file (`cglib.config.params.Params`), for the same reason."""

    run: Any
    data: Any
    train: Any


FAMILIES = ("clip", "group", "text")  # what Table 3's gain rows compare: CLIP-style pairs, grouped losses, text-only


class NoOptions(Section):
    """The options of an objective that takes none (a run entry's `options` must then be empty)."""


def entry_option(entry: RunEntry, key: str) -> Any:
    """A run entry's option `key` (None when unset), before or after its options were validated."""
    options = entry.options
    return options.get(key) if isinstance(options, dict) else getattr(options, key, None)


class ObjectiveSpec:
    """An objective as the params file sees it: class attributes and the checks that read only params."""

    name: ClassVar[str] = ""  # the run entry's `loss` (a plug-in's is its "module:Class" path)
    label: ClassVar[str] = ""  # how tables and figures name the objective
    family: ClassVar[str] = "clip"  # one of FAMILIES: Table 3's gain rows compare families, never names
    related: ClassVar[str | None] = None  # a related method (not one of the paper's rows): its description
    phase: ClassVar[str] = "train"  # "train": image-text group batches; "re": a text-only phase (re.py)
    min_groups: ClassVar[int] = 1  # groups per batch (train.groups_per_batch) it needs to contrast anything
    min_pairs: ClassVar[int] = 1  # pairs per group (train.pairs_per_group) it needs
    Options: ClassVar[type[Section]] = NoOptions  # its run entries' `options` (validated with the params)
    distributed_refusal: ClassVar[str | None] = None  # why it cannot run under torchrun (None: it can)
    permutes_keywords: ClassVar[bool] = False  # it reads the captions' keyword relations (prepared before training)

    @classmethod
    def exposure(cls, params: RunParams, entry: RunEntry) -> list[str]:
        """Why training with this objective shows the model strings that evaluation uses as queries ([]: none)."""
        return []

    @classmethod
    def for_entry(cls, entry: RunEntry) -> type[ObjectiveSpec]:
        """The objective that trains this entry (a variant chosen by the entry's options; default: this one)."""
        return cls

    @classmethod
    def check_entry(cls, entry: RunEntry) -> None:
        """Raise ValueError (naming the fix) for a run entry this objective cannot train (params validation)."""

    @classmethod
    def resolve_options(cls, options: Section, params: RunParams) -> Section:
        """The entry's options with what they leave unset filled from the params (a protocol key from run.protocol,
        a group loss's alpha from train.alpha): what the run's spec holds and the objective is built with."""
        return options.model_copy(update=protocol_options(options, params.run.protocol))

    @classmethod
    def input_files(cls, params: RunParams, entry: RunEntry) -> list[tuple[str, Path | None]]:
        """(params key, path) of the files its runs read beyond the data source (checked to exist)."""
        return []

    @classmethod
    def check(cls, params: RunParams, entry: RunEntry) -> None:
        """Raise ValueError (naming the fix) when the params cannot train this objective."""
        t = params.train
        if t.groups_per_batch < cls.min_groups:
            raise ValueError(f"run {entry.name!r}: the {cls.name} loss contrasts groups: set train.groups_per_batch "
                             f">= {cls.min_groups}")
        if t.pairs_per_group < cls.min_pairs:
            raise ValueError(f"run {entry.name!r}: the {cls.name} loss contrasts pairs within a group: set "
                             f"train.pairs_per_group >= {cls.min_pairs}")
