"""The shipped concept taxonomy (`taxonomy.yaml`): l1 scene concepts with their content, parents up to l_max.

Shared by the synthetic world (what to draw and caption) and the offline abstraction backend (which concepts
exist). Names are unique across all levels, so a string always means one node at one level.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import yaml

DEFAULT_TAXONOMY = Path(__file__).with_name("taxonomy.yaml")


@dataclass(frozen=True)
class SceneContent:
    """What appears in an l1 scene: the settings it happens in and the objects drawn in it."""

    settings: tuple[str, ...]
    objects: tuple[str, ...]


@dataclass
class Taxonomy:
    """A tree of concept names: `parents` maps every non-top concept to its parent one level up."""

    levels: int
    parents: dict[str, str]
    scenes: dict[str, SceneContent]  # l1 name -> content

    def __post_init__(self) -> None:
        for l1, content in self.scenes.items():
            if not content.settings or not content.objects:
                raise ValueError(f"taxonomy: l1 concept '{l1}' needs at least one setting and one object")
        for l1 in self.scenes:
            chain = self.chain(l1)  # raises on a broken or cyclic chain
            if len(chain) != self.levels:
                raise ValueError(f"taxonomy: l1 concept '{l1}' has a chain of {len(chain)} levels "
                                 f"({' -> '.join(chain)}), expected {self.levels}; fix its parents")
        seen: dict[str, int] = {}
        for l1 in self.scenes:
            for level, name in enumerate(self.chain(l1), start=1):
                if seen.setdefault(name, level) != level:
                    raise ValueError(f"taxonomy: '{name}' appears at levels {seen[name]} and {level}; "
                                     "every concept name must belong to exactly one level")

    @property
    def l1(self) -> list[str]:
        """The l1 concepts in file order."""
        return list(self.scenes)

    def chain(self, l1: str) -> list[str]:
        """Names from `l1` up to the top level: [l1, l2, ..., l_levels]."""
        if l1 not in self.scenes:
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
        return {name: lvl for l1 in self.scenes for lvl, name in enumerate(self.chain(l1), start=1)}

    def names(self, level: int) -> list[str]:
        """Distinct concept names at `level`, in first-appearance order."""
        return list(dict.fromkeys(self.chain(l1)[level - 1] for l1 in self.scenes))

    def all_names(self) -> list[str]:
        """Every concept name of every level."""
        return list(self.level_of)


def load_taxonomy(path: str | Path | None = None) -> Taxonomy:
    """Load and validate a taxonomy YAML (default: the one shipped in the package)."""
    path = Path(path) if path else DEFAULT_TAXONOMY
    if not path.is_file():
        raise FileNotFoundError(f"taxonomy file not found: {path}")
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    try:
        levels = int(raw["levels"])
        parents = {str(k): str(v) for k, v in raw["parents"].items()}
        scenes = {str(name): SceneContent(settings=tuple(c["settings"]), objects=tuple(c["objects"]))
                  for name, c in raw["scenes"].items()}
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: malformed taxonomy ({exc!r}); it needs 'levels', 'parents' "
                         "(child: parent) and 'scenes' (l1: {settings: [...], objects: [...]})") from None
    return Taxonomy(levels=levels, parents=parents, scenes=scenes)
