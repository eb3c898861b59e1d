"""The whole params file: every section, and the rules that span sections."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, model_validator

from cglib.config.base import Section
from cglib.config.evaluation import EvalParams, SearchParams, VizParams
from cglib.config.inputs import DataParams, LLMParams, MagicParams, ModelParams, NgramParams, RunParams
from cglib.config.protocol import apply_protocol
from cglib.config.training import TrainParams


class Params(Section):
    run: RunParams = Field(default_factory=RunParams)
    data: DataParams = Field(default_factory=DataParams)
    llm: LLMParams = Field(default_factory=LLMParams)
    magic: MagicParams = Field(default_factory=MagicParams)
    ngram: NgramParams = Field(default_factory=NgramParams)
    model: ModelParams = Field(default_factory=ModelParams)
    train: TrainParams = Field(default_factory=TrainParams)
    eval: EvalParams = Field(default_factory=EvalParams)
    viz: VizParams = Field(default_factory=VizParams)
    search: SearchParams = Field(default_factory=SearchParams)

    @model_validator(mode="before")
    @classmethod
    def _protocol(cls, data: Any) -> Any:
        """run.protocol fills the protocol keys of the train section the file leaves unset."""
        return apply_protocol(data)

    @model_validator(mode="after")
    def _cross_section(self, info: ValidationInfo) -> Params:
        """The rules that span sections. With a `problems` list in the validation context (`parse_params`) every
        broken rule is added to it, so a file's problems are all reported in one pass; without, they are raised
        together."""
        problems = self.cross_section_problems()
        collect = (info.context or {}).get("problems")
        if collect is not None:
            collect.extend(problems)
        elif problems:
            raise ValueError("\n".join(message for _, message in problems))
        return self

    def cross_section_problems(self) -> list[tuple[tuple[str, ...], str]]:
        """Every rule between sections that this file breaks: (the keys involved, the first one being where to
        fix it; the message with the fix)."""
        problems: list[tuple[tuple[str, ...], str]] = []
        if self.viz.color_level > self.magic.l_max:
            problems.append((("viz.color_level", "magic.l_max"),
                             (f"viz.color_level ({self.viz.color_level}) exceeds magic.l_max ({self.magic.l_max}); "
                             "lower viz.color_level")))
        known = ["zero-shot", *(r.name for r in self.train.runs)]
        unknown = [m for m in self.viz.models or [] if m not in known]
        if unknown:
            problems.append((("viz.models", "train.runs"),
                             (f"viz.models names {unknown}, not the zero-shot model or a train.runs entry; pick "
                              f"from {known}")))
        if self.train.base.corpus == "synthetic" and self.data.source != "synthetic":
            problems.append((("train.base.corpus", "data.source"),
                             ("train.base.corpus 'synthetic' renders the synthetic world; with data.source "
                             f"'{self.data.source}' use train.base.corpus: magic_train (or none)")))
        if self.train.text_trains == "projection" and self.model.text_projection == "none":
            problems.append((("train.text_trains", "model.text_projection"),
                             ("train.text_trains: projection trains the text projection alone, and the model has "
                             "none: set model.text_projection: identity (text_tower: minilm), or text_trains: tower")))
        clash = sorted({z.name for z in self.eval.zoo} & {r.name for r in self.train.runs})
        if clash:
            problems.append((("eval.zoo", "train.runs"),
                             (f"eval.zoo names {clash} are also train.runs names; rename the eval.zoo entries "
                             "(every row of Table 3 needs its own name)")))
        search = self._search_run()
        if search:
            problems.append((("search.run", "train.runs", "search.space"), search))
        if self.llm.backend == "oracle" and self.data.source != "synthetic":
            problems.append((("llm.backend", "data.source"),
                             ("llm.backend 'oracle' needs the synthetic world's ground truth; "
                             "use data.source: synthetic or another backend")))
        return problems

    def _search_run(self) -> str | None:
        """What is wrong with search.run (None: nothing): it must name an image-text run whose tuned keys are
        not overridden in its train.runs entry."""
        name = self.search.run
        if name is None:
            return None
        entry = next((r for r in self.train.runs if r.name == name), None)
        if entry is None:
            return (f"search.run {name!r} is not a train.runs entry; choose one of "
                    f"{[r.name for r in self.train.runs]} (or null for the first image-text run)")
        if not entry.trains_images():
            return (f"search.run {name!r} has loss {entry.loss}, which trains the text tower alone; tune an "
                    "image-text run (loss clip, pairwise or centroid)")
        if entry.groups != "magic":
            return (f"search.run {name!r} trains on groups: {entry.groups}, but the search's validation "
                    "split is carved from MAGIC's groups; tune a groups: magic run")
        for key, where in (("tau", "tau"), ("alpha", "options.alpha")):
            own = getattr(entry, key, None) if key == "tau" else getattr(entry.options, key, None)
            if own is not None and getattr(self.search.space, key) is not None:
                return (f"train.runs entry {name!r} overrides {key}, so a tuned train.{key} would not "
                        f"reach it; remove its {where} or set search.space.{key}: null")
        return None

    def search_run(self) -> str:
        """The train.runs entry the search tunes: search.run, else the first entry with an image-text loss."""
        if self.search.run is not None:
            return self.search.run
        for entry in self.train.runs:
            if entry.trains_images() and entry.groups == "magic":
                return entry.name
        raise ValueError("train.runs has no image-text run (loss clip, pairwise or centroid) to tune; add one "
                         "or set search.run")

    def run_dir(self, root: Path | None = None) -> Path:
        """The run directory `<output_dir>/<name>`, relative paths resolved against `root` (default: cwd)."""
        base = self.run.output_dir if self.run.output_dir.is_absolute() else (root or Path.cwd()) / self.run.output_dir
        return base / self.run.name
