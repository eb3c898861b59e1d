"""Reading and writing magic.json: the schema (schema.py) checked on load together with the DAG invariants
(invariants.py), which is why this sits above both rather than inside the schema module."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import ValidationError

from cglib.magic.invariants import check_invariants
from cglib.magic.schema import SCHEMA_VERSION, MagicFile
from cglib.strict_yaml import NotTextError, read_text


def save_magic(magic: MagicFile, path: str | Path) -> Path:
    """Write magic.json (atomic rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(magic.model_dump_json(indent=1), encoding="utf-8")
    tmp.replace(path)
    return path


def load_magic(path: str | Path) -> MagicFile:
    """Read and validate magic.json: schema version, structure and DAG invariants, with errors naming the fix."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run notebook 03_magic_dag first")
    try:
        raw = json.loads(read_text(path))
    except NotTextError as exc:
        raise ValueError(f"{exc}; magic.json is corrupted: rebuild it with notebook 03_magic_dag") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is corrupted (not valid JSON: {exc}); rebuild it with notebook 03_magic_dag") from None
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if version != SCHEMA_VERSION:
        raise ValueError(f"{path} has schema_version {version!r}; this cglib reads version {SCHEMA_VERSION}: "
                         "rebuild it with notebook 03_magic_dag")
    try:
        magic = MagicFile.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{path} is malformed at {where}: {first['msg']} ({exc.error_count()} problems); "
                         "rebuild it with notebook 03_magic_dag") from None
    check_invariants(magic)
    return magic


def content_digest(magic: MagicFile) -> str:
    """Hash of a MAGIC file's content without its provenance and statistics, which hold the build's timing and
    cache counts: a rebuild of the same DAG (notebook 03 run again) hashes the same."""
    return hashlib.sha1(magic.model_dump_json(exclude={"provenance", "stats"}).encode()).hexdigest()[:16]
