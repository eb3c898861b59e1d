"""Concept taxonomies: l1 concepts with their content or description, parents up to l_max.

Two ship in the package. `taxonomy.yaml`, the synthetic world's, gives each l1 scene its settings and objects:
what the world draws and captions, and what the offline abstraction backend embeds. `everyday_taxonomy.yaml`
covers real everyday photographs (COCO's kind of scenes): each l1 concept has a description written like a caption,
which the offline backend embeds instead. A user's taxonomy file uses the second schema (levels, parents,
descriptions). Names are unique across all levels, so a string always means one node at one level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import yaml

DEFAULT_TAXONOMY = Path(__file__).with_name("taxonomy.yaml")
SHIPPED_TAXONOMIES = {"synthetic": DEFAULT_TAXONOMY, "everyday": Path(__file__).with_name("everyday_taxonomy.yaml")}


@dataclass(frozen=True)
class SceneContent:
    """What appears in an l1 scene: the settings it happens in and the objects drawn in it."""

    settings: tuple[str, ...]
    objects: tuple[str, ...]


@dataclass
class Taxonomy:
    """A tree of concept names: `parents` maps every non-top concept to its parent one level up. The l1 concepts
    are those with scene content (the synthetic world) or, in a taxonomy without scenes, with a description."""

    levels: int
    parents: dict[str, str]
    scenes: dict[str, SceneContent]  # l1 name -> content (the synthetic world's taxonomy)
    descriptions: dict[str, str] = field(default_factory=dict)  # l1 name -> what a photo of it shows

    def __post_init__(self) -> None:
        if not self.l1:
            raise ValueError("taxonomy: no l1 concept; give 'descriptions' (l1: a caption-like description) or "
                             "'scenes'")
        for l1, content in self.scenes.items():
            if not content.settings or not content.objects:
                raise ValueError(f"taxonomy: l1 concept '{l1}' needs at least one setting and one object")
        if not self.scenes:
            for l1, text in self.descriptions.items():
                if not isinstance(text, str) or not text.strip():
                    raise ValueError(f"taxonomy: l1 concept '{l1}' needs a description (a sentence saying what a "
                                     "photo of it shows)")
        for l1 in self.l1:
            chain = self.chain(l1)  # raises on a broken or cyclic chain
            if len(chain) != self.levels:
                raise ValueError(f"taxonomy: l1 concept '{l1}' has a chain of {len(chain)} levels "
                                 f"({' -> '.join(chain)}), expected {self.levels}; fix its parents")
        seen: dict[str, int] = {}
        for l1 in self.l1:
            for level, name in enumerate(self.chain(l1), start=1):
                if seen.setdefault(name, level) != level:
                    raise ValueError(f"taxonomy: '{name}' appears at levels {seen[name]} and {level}; "
                                     "every concept name must belong to exactly one level")
        unreached = sorted(set(self.parents) - set(seen))
        if unreached:
            raise ValueError(f"taxonomy: '{unreached[0]}' has a parent but no l1 concept leads to it "
                             f"({len(unreached)} such names); give it a description or remove it from parents")

    @property
    def l1(self) -> list[str]:
        """The l1 concepts in file order."""
        return list(self.scenes or self.descriptions)

    def chain(self, l1: str) -> list[str]:
        """Names from `l1` up to the top level: [l1, l2, ..., l_levels]."""
        if l1 not in (self.scenes or self.descriptions):
            raise KeyError(f"'{l1}' is not an l1 concept of the taxonomy")
        chain = [l1]
        while chain[-1] in self.parents:
            chain.append(self.parents[chain[-1]])
            if len(chain) > self.levels:
                raise ValueError(f"taxonomy: chain from '{l1}' is longer than {self.levels} levels or cyclic")
        return chain

    @cached_property
    def level_of(self) -> dict[str, int]:
        """Level (1-based) of every concept name."""
        return {name: lvl for l1 in self.l1 for lvl, name in enumerate(self.chain(l1), start=1)}

    def names(self, level: int) -> list[str]:
        """Distinct concept names at `level`, in first-appearance order."""
        return list(dict.fromkeys(self.chain(l1)[level - 1] for l1 in self.l1))

    def all_names(self) -> list[str]:
        """Every concept name of every level."""
        return list(self.level_of)


def taxonomy_path(source: str | Path | None = None) -> Path:
    """The file of a taxonomy source: 'synthetic' (the default), 'everyday', or a path to a user's YAML."""
    if source is None or str(source) in SHIPPED_TAXONOMIES:
        return SHIPPED_TAXONOMIES[str(source or "synthetic")]
    return Path(source)


def load_taxonomy(source: str | Path | None = None) -> Taxonomy:
    """Load and validate a taxonomy: 'synthetic' (default, the world's), 'everyday', or a YAML path."""
    path = taxonomy_path(source)
    if not path.is_file():
        raise FileNotFoundError(f"taxonomy file not found: {path} (llm.offline_taxonomy takes synthetic, everyday "
                                "or the path of a YAML file with levels, parents and descriptions)")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    try:
        levels = int(raw["levels"])
        parents = {str(k): str(v) for k, v in raw["parents"].items()}
        scenes = {str(name): SceneContent(settings=tuple(c["settings"]), objects=tuple(c["objects"]))
                  for name, c in (raw.get("scenes") or {}).items()}
        descriptions = {str(k): v for k, v in (raw.get("descriptions") or {}).items()}
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"{path}: malformed taxonomy ({exc!r}); it needs 'levels', 'parents' (child: parent) and "
                         "'descriptions' (l1: a sentence; the synthetic world's file has 'scenes' instead)") from None
    try:
        return Taxonomy(levels=levels, parents=parents, scenes=scenes, descriptions=descriptions)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
