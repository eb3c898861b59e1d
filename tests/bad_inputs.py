"""The bad-input catalogue: every kind of broken file a user can hand cglib, what they see, and the exit code.

One table drives both the test (tests/test_hardening.py runs every case and checks the exit code and the
message) and the guide's troubleshooting table (book/troubleshooting.md): `python tests/bad_inputs.py` runs the
cases in a temporary folder and prints the markdown with the messages as they really are.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PARAMS = "params file (`cglib validate` / `cglib run`)"
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))


@dataclass(frozen=True)
class BadInput:
    """One broken file: where it is read, what is wrong, the exit code, a fragment of the message."""

    file: str  # the file as the user knows it
    problem: str
    exit_code: int  # of `cglib validate` / `cglib run` (1: the notebook that reads the file stops)
    message: str  # must appear in what the user sees
    make: Callable[[Path], Path]  # writes the bad file under a folder and returns its path
    reader: str  # params | magic | chains | cache | export


def _text(name: str, text: str) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / name
        path.write_text(text, encoding="utf-8")
        return path
    return make


def _bytes(name: str, data: bytes) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        path = folder / name
        path.write_bytes(data)
        return path
    return make


def _absent(name: str) -> Callable[[Path], Path]:
    return lambda folder: folder / name


def _damaged_cache(folder: Path) -> Path:
    """A real cache whose middle pages are overwritten (what a disk error or a power cut leaves)."""
    from cglib.llm.base import Outcome
    from cglib.llm.cache import ResultCache

    path = folder / "cache.sqlite"
    with ResultCache(path) as cache:
        for i in range(3000):
            cache.put(f"k{i}", "concept", "openai", "m", "v1", Outcome(ok=True, value="x" * 100), commit=False)
        cache.commit()
        cache.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8192] = os.urandom(8192)
    path.write_bytes(bytes(data))
    return path


def _tiny_export(folder: Path) -> Path:
    """A sound MAGIC export of the tests' tiny hand-built dataset (images written as files), in folder/export."""
    from PIL import Image

    from cglib.data.dataset import CaptionDataset
    from cglib.magic.files import save_magic
    from cglib.magic.hf_export import export_magic
    from tests.factories import tiny_magic

    magic, dataset = tiny_magic(per_group=4)
    run = folder / "run"
    (run / "images").mkdir(parents=True, exist_ok=True)
    files = {}
    for row, image_id in enumerate(dataset.image_ids):
        files[image_id] = run / "images" / f"{image_id}.png"
        Image.fromarray(dataset.pixels[row]).save(files[image_id])
    CaptionDataset(source="coco", image_ids=dataset.image_ids, captions=dataset.captions, image_files=files,
                   meta={"image_dir": str(run / "images")}).save(run / "captions")
    save_magic(magic, run / "magic" / "magic.json")
    (run / "params.yaml").write_text("{}\n")
    export_magic(run, folder / "export")
    return folder / "export"


def _damaged_export(damage: str) -> Callable[[Path], Path]:
    """An export with one damage; returns the file the reader must name."""
    def make(folder: Path) -> Path:
        import pyarrow.parquet as pq

        from cglib.magic.hf_export import CARD_FILE, NODES_FILE, SPLIT_FILES

        export = _tiny_export(folder)
        if damage == "missing split":
            (export / SPLIT_FILES["test"]).unlink()
            return export / SPLIT_FILES["test"]
        if damage == "undefined node":  # the nodes table loses an l2 node that image rows name
            table = pq.read_table(export / NODES_FILE)
            rows = [r for r in table.to_pylist() if r["id"] != "l2:sport"]
            pq.write_table(table.from_pylist(rows, schema=table.schema), export / NODES_FILE)
            return export / SPLIT_FILES["train"]
        if damage == "not parquet":
            (export / NODES_FILE).write_bytes(PNG)
            return export / NODES_FILE
        card = export / CARD_FILE
        card.write_text(card.read_text(encoding="utf-8").replace("magic_schema_version: 2", "magic_schema_version: 9"),
                        encoding="utf-8")
        return card
    return make


EXPORT = "MAGIC export (`magic.source`)"

CASES: list[BadInput] = [
    BadInput(PARAMS, "file does not exist", 2, "params file not found", _absent("p.yaml"), "params"),
    BadInput(PARAMS, "binary file (an image passed by mistake)", 2, "is not a text file",
             _bytes("p.yaml", PNG), "params"),
    BadInput(PARAMS, "text that is not UTF-8 (Latin-1)", 2, "is not a UTF-8 text file",
             _bytes("p.yaml", "run:\n  name: caf\xe9\n".encode("latin-1")), "params"),
    BadInput(PARAMS, "saved as UTF-16 (some Windows editors)", 2, "is UTF-16 text, not UTF-8; save it as UTF-8",
             _bytes("p.yaml", "run:\n  name: mine\n".encode("utf-16")), "params"),
    BadInput(PARAMS, "YAML syntax error", 2, "not valid YAML at line 2", _text("p.yaml", "run: [\n"),
             "params"),
    BadInput(PARAMS, "a section twice (two `run:`)", 2, "duplicate key 'run' at lines 1 and 3",
             _text("p.yaml", "run:\n  name: mine\nrun:\n  profile: demo\n"), "params"),
    BadInput(PARAMS, "a key twice in a section", 2, "duplicate key 'run.seed' at lines 2 and 4",
             _text("p.yaml", "run:\n  seed: 1\n  name: x\n  seed: 2\n"), "params"),
    BadInput(PARAMS, "a list instead of sections", 2, "params must be a YAML mapping",
             _text("p.yaml", "- run\n- train\n"), "params"),
    BadInput(PARAMS, "misspelt key", 2, "train.groupz_per_batch: unknown key; did you mean 'groups_per_batch'",
             _text("p.yaml", "train:\n  groupz_per_batch: 3\n"), "params"),
    BadInput(PARAMS, "value out of range", 2, "train.groups_per_batch: Input should be greater than or equal to 1",
             _text("p.yaml", "train:\n  groups_per_batch: -1\n"), "params"),
    BadInput(PARAMS, "input path that does not exist", 2, "data.coco_captions: path does not exist",
             _text("p.yaml", "data:\n  source: coco\n  coco_captions: nope.json\n  coco_images: imgs\n"), "params"),
    BadInput("`magic.json`", "file does not exist", 1, "not found: run notebook 03_magic_dag first",
             _absent("magic.json"), "magic"),
    BadInput("`magic.json`", "binary file", 1, "is not a text file (a NUL byte at offset 8); magic.json is corrupted: "
             "rebuild it with notebook 03_magic_dag", _bytes("magic.json", PNG), "magic"),
    BadInput("`magic.json`", "cut JSON (disk full)", 1, "is corrupted (not valid JSON",
             _text("magic.json", '{"schema_version": 2, "nodes": ['), "magic"),
    BadInput("`magic.json`", "written by an older cglib", 1, "has schema_version 1; this cglib reads version 2",
             _text("magic.json", json.dumps({"schema_version": 1})), "magic"),
    BadInput("`chains.jsonl`", "binary file", 1, "chains.jsonl is corrupted: re-run notebook 02_abstraction",
             _bytes("chains.jsonl", PNG), "chains"),
    BadInput("`chains.jsonl`", "a broken line", 1, "chains.jsonl:2 is not valid JSON",
             _text("chains.jsonl", '{"image_id": "a", "status": "ok", "chain": ["x"]}\n{"image_id": \n'), "chains"),
    BadInput(EXPORT, "a split file missing", 1, "is missing: the export is incomplete",
             _damaged_export("missing split"), "export"),
    BadInput(EXPORT, "a node id referenced but not defined", 1, "which nodes/nodes-00000-of-00001.parquet does not "
             "define", _damaged_export("undefined node"), "export"),
    BadInput(EXPORT, "a table that is not Parquet", 1, "is not a readable Parquet file",
             _damaged_export("not parquet"), "export"),
    BadInput(EXPORT, "a magic.json schema version this cglib does not know", 1,
             "magic_schema_version 9 is unknown to this cglib", _damaged_export("schema version"), "export"),
    BadInput("`cache.sqlite`", "not a database", 0, "is corrupted (file is not a database); it was moved to",
             _bytes("cache.sqlite", PNG), "cache"),
    BadInput("`cache.sqlite`", "damaged pages", 0, "is corrupted (integrity check failed", _damaged_cache, "cache"),
]


def run_case(case: BadInput, folder: Path) -> tuple[int, str]:
    """Hand the bad file to the code that reads it; (exit code the user gets, message they see)."""
    path = case.make(folder)
    if case.reader == "params":
        from cglib.cli import main

        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["validate", str(path)])
        return code, err.getvalue()
    if case.reader == "cache":
        from cglib.llm.cache import CacheRebuiltWarning, ResultCache

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ResultCache(path).close()
        return 0, "\n".join(str(w.message) for w in caught if issubclass(w.category, CacheRebuiltWarning))
    if case.reader == "export":
        from cglib.magic.hf_import import read_export

        try:
            read_export(folder / "export")
        except ValueError as exc:  # notebook 01 (and 02, 03) stops with this message: `cglib run` exits 1
            return 1, str(exc)
        return 0, ""
    from cglib.llm.chains import load_chains
    from cglib.magic.files import load_magic

    try:
        (load_magic if case.reader == "magic" else load_chains)(path)
    except (ValueError, FileNotFoundError) as exc:  # the notebook stops with this message: `cglib run` exits 1
        return 1, str(exc)
    return 0, ""


def markdown() -> str:
    """The catalogue as a markdown table, with each message as the code really words it."""
    rows = ["| file | what is wrong | exit code | message |", "|---|---|---|---|"]
    for case in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            code, message = run_case(case, Path(tmp))
            message = message.replace(str(Path(tmp).resolve()), "…").replace(tmp, "…")
        lines = [ln.strip() for ln in message.strip().splitlines()]
        if case.reader == "params":  # the CLI's "error: invalid params PATH:" line, then one line per problem
            lines = lines[1:]
        first = (lines[0] if case.reader != "cache" else " ".join(lines)) if lines else ""
        # the timestamped path differs each run
        first = re.sub(r"…/cache\.sqlite\.corrupt-\S+? and", "`cache.sqlite.corrupt-<UTC time>` and", first)
        rows.append(f"| {case.file} | {case.problem} | {code} | {first.replace('|', '/')} |")
    return "\n".join(rows)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    print(markdown())
