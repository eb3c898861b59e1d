"""What every params section shares: the base model that forbids unknown keys, the error type, constants."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

SHIPPED_TAXONOMY_NAMES = ("synthetic", "everyday")  # llm.offline_taxonomy values naming a taxonomy of the package
# a Hugging Face Hub repository id, owner/name (magic.source)
HUB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$"


class ParamsError(ValueError):
    """A params file is missing, unreadable or invalid; the message names each bad key and its fix."""


def _unique(names: list[str], key: str) -> list[str]:
    """`names` when no two are equal, else ValueError naming the duplicates and `key`."""
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"duplicate names {dupes}; give every entry of {key} its own name")
    return names


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
