"""Take MAGIC from an export instead of building it (`magic.source: PATH_OR_HUB_ID` in the params).

An export is what `cglib.magic.hf_export.export_magic` writes: a dataset card with YAML metadata, Parquet tables
and `stats.json`. `read_export` checks everything before anything is used: the card's export format and
magic.json schema version, that every file is present and has its columns, that every node id a row refers to
is defined in the nodes table, then MAGIC's invariants and that each row's chain columns agree with the DAG. A
problem stops the import with a message naming the file and the problem (`ExportError`).

`captions_from_export` gives notebook 01 its dataset: a synthetic-world export re-renders its images and
ground truth from the world's parameters and seed (checked against the export's captions); a real-image export
resolves file names against the user's COCO folder (`data.coco_images`), and images that are missing or
unreadable there are counted by reason and reported. They stay in MAGIC, the dataset's definition, and the
image cache skips and counts them in training and evaluation, as it does for any unreadable image.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from pydantic import ValidationError

from cglib.config import HUB_ID_PATTERN, Params
from cglib.data.coco import image_problems
from cglib.data.dataset import CaptionDataset
from cglib.data.synthetic import make_world
from cglib.magic.hf_export import (
    CARD_FILE,
    EXPORT_FORMAT_VERSION,
    MERGE_SCHEMA,
    MERGES_FILE,
    NODE_SCHEMA,
    NODES_FILE,
    REMOVAL_SCHEMA,
    REMOVALS_FILE,
    SPLIT_FILES,
    SPLITS,
    STATS_FILE,
    WORLD_KEYS,
    image_schema,
)
from cglib.magic.invariants import MagicInvariantError, check_invariants
from cglib.magic.schema import SCHEMA_VERSION, ImageRecord, MagicFile, MergeRecord, Node, RemovalRecord
from cglib.magic.stats import compute_stats, table1
from cglib.run import provenance

logger = logging.getLogger(__name__)

REEXPORT = "export it again with `cglib export-magic RUN_DIR DEST`"
SHOWN_IDS = 20


class ExportError(ValueError):
    """A MAGIC export is corrupt, incomplete or of an unknown version; the message names the file and the fix."""


@dataclass
class MagicExport:
    """A checked export: its card metadata, the MAGIC file it holds and its image rows (source order)."""

    directory: Path
    source: str  # the magic.source value it came from (a folder or a Hub id)
    card: dict
    magic: MagicFile
    rows: list[dict]
    checked: list[str] = field(default_factory=list)  # what read_export verified, one line each

    @property
    def info(self) -> dict:
        """The card's `cglib_magic` block (format, schema, world, provenance, parameters, Table 1)."""
        return self.card["cglib_magic"]

    def raw_chains(self) -> dict[str, list[str]]:
        """Each image's chain as the abstraction answered it (before merges), as in abstraction/chains.jsonl."""
        return {r["image_id"]: list(r["raw_chain"]) for r in self.rows if r["raw_chain"]}

    def provenance_table(self) -> pd.DataFrame:
        """Who built the dataset, with what (the card's provenance), one row per item."""
        built = self.info["built_by"]
        magic_params = self.info["parameters"].get("magic") or {}
        rows = {"export": str(self.source), **{k.replace("_", " "): v for k, v in built.items()},
                "world": self.info["world"] or f"{self.info['source']} images, by file name",
                **{f"magic.{k}": magic_params[k] for k in ("size_min", "sim_min", "hard_negative_sim",
                                                           "min_hard_negatives", "split", "test_fraction")
                   if k in magic_params},
                "run.seed": self.info["parameters"].get("run.seed")}
        return pd.DataFrame({"value": [str(v) for v in rows.values()]}, index=pd.Index(list(rows), name="item"))


# ------------------------------------------------------------------------------------------- locating
def resolve_source(source: str) -> Path:
    """The export folder of `magic.source`: a local folder, or a Hugging Face dataset id downloaded once."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if re.match(HUB_ID_PATTERN, source):
        return download_from_hub(source)
    raise ExportError(f"magic.source {source!r}: no such folder, and not a Hugging Face dataset id (owner/name); "
                      "point it at a folder written by `cglib export-magic`, or a Hub id")


def download_from_hub(repo_id: str) -> Path:
    """snapshot_download of a dataset repository (cached by huggingface_hub; offline, only a cached copy works)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=repo_id, repo_type="dataset"))
    except Exception as exc:  # noqa: BLE001 - offline, unknown repo, HTTP error: the same fix for each
        raise ExportError(
            f"magic.source {repo_id!r}: cannot download the Hugging Face dataset ({type(exc).__name__}: {exc}); "
            "check the id and the network (with HF_HUB_OFFLINE=1 only a cached copy is used), or download it "
            f"where there is a network (`huggingface-cli download {repo_id} --repo-type dataset --local-dir DIR`) "
            "and set magic.source to DIR") from None


# ------------------------------------------------------------------------------------------- reading
def read_card(directory: Path) -> dict:
    """The card's YAML metadata, with its export format and magic.json schema version checked."""
    path = directory / CARD_FILE
    if not path.is_file():
        raise ExportError(f"{path} not found: a MAGIC export starts with its dataset card; {REEXPORT}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ExportError(f"{path} is not UTF-8 text ({exc}); the card is corrupted: {REEXPORT}") from None
    if not text.startswith("---\n") or "\n---\n" not in text[3:]:
        raise ExportError(f"{path} has no YAML metadata header (between two '---' lines); {REEXPORT}")
    try:
        meta = yaml.safe_load(text[4:].split("\n---\n", 1)[0])
    except yaml.YAMLError as exc:
        raise ExportError(f"{path}: the YAML metadata is not valid YAML ({exc}); {REEXPORT}") from None
    info = meta.get("cglib_magic") if isinstance(meta, dict) else None
    if not isinstance(info, dict):
        raise ExportError(f"{path}: no `cglib_magic` block in the YAML metadata, so this is not a MAGIC export "
                          f"written by cglib; {REEXPORT}")
    version = info.get("format_version")
    if version != EXPORT_FORMAT_VERSION:
        raise ExportError(f"{path}: export format_version {version!r} is unknown to this cglib (it reads "
                          f"{EXPORT_FORMAT_VERSION}); update cglib, or {REEXPORT} with this cglib")
    schema = info.get("magic_schema_version")
    if schema != SCHEMA_VERSION:
        raise ExportError(f"{path}: magic_schema_version {schema!r} is unknown to this cglib (it reads "
                          f"{SCHEMA_VERSION}); update cglib, or rebuild MAGIC and {REEXPORT}")
    missing = [k for k in ("l_max", "split_kind", "generalize", "source", "world", "skipped", "built_by",
                           "parameters") if k not in info]
    if missing:
        raise ExportError(f"{path}: the cglib_magic metadata lacks {missing}; {REEXPORT}")
    return meta


def read_table(directory: Path, relative: str, schema: pa.Schema) -> list[dict]:
    """A Parquet table of the export as rows, its columns and types checked against `schema`."""
    path = directory / relative
    if not path.is_file():
        raise ExportError(f"{path} is missing: the export is incomplete (copy the whole folder, or {REEXPORT})")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise ExportError(f"{path} is not a readable Parquet file ({exc}); {REEXPORT}") from None
    absent = [name for name in schema.names if name not in table.column_names]
    if absent:
        raise ExportError(f"{path} lacks the columns {absent}; {REEXPORT}")
    try:
        return table.select(schema.names).cast(schema).to_pylist()
    except (pa.ArrowException, ValueError) as exc:
        raise ExportError(f"{path}: a column has the wrong type ({exc}); {REEXPORT}") from None


def _check_references(path: Path, rows: list[dict], key: str, columns: dict[str, str], defined: set[str]) -> None:
    """Every node id in `columns` of `rows` must be a node of the nodes table; else an error naming file and row.

    `columns` maps a column to how it holds ids: 'id' (one id or None), 'ids' (a list), 'node' (a list of
    structs with a `node` field)."""
    for n, row in enumerate(rows):
        for column, kind in columns.items():
            value = row[column]
            refs = ([value] if value is not None else []) if kind == "id" else \
                list(value or []) if kind == "ids" else [item["node"] for item in value or []]
            for ref in refs:
                if ref not in defined:
                    raise ExportError(f"{path}: row {n} ({key} {row[key]!r}), column {column!r}, refers to node "
                                      f"{ref!r}, which {NODES_FILE} does not define; the export is incomplete or "
                                      f"was edited: {REEXPORT}")


def read_export(directory: str | Path, source: str | None = None) -> MagicExport:
    """Read and check an export folder (see the module docstring); ExportError naming the file otherwise."""
    directory = Path(directory)
    meta = read_card(directory)
    info = meta["cglib_magic"]
    l_max = int(info["l_max"])
    checked = [f"{CARD_FILE}: export format {info['format_version']}, magic.json schema {info['magic_schema_version']}"]
    by_split = {split: read_table(directory, SPLIT_FILES[split], image_schema(l_max)) for split in SPLITS}
    nodes = read_table(directory, NODES_FILE, NODE_SCHEMA)
    merges = read_table(directory, MERGES_FILE, MERGE_SCHEMA)
    removals = read_table(directory, REMOVALS_FILE, REMOVAL_SCHEMA)
    stats_path = directory / STATS_FILE
    if not stats_path.is_file():
        raise ExportError(f"{stats_path} is missing: the export is incomplete (copy the whole folder, or {REEXPORT})")
    try:
        stats = json.loads(stats_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ExportError(f"{stats_path} is not valid JSON ({exc}); {REEXPORT}") from None
    if not isinstance(stats, dict) or not {"stats", "provenance"} <= set(stats):
        raise ExportError(f"{stats_path} lacks its 'stats' and 'provenance' blocks; {REEXPORT}")
    checked.append(f"files: {', '.join([*SPLIT_FILES.values(), NODES_FILE, MERGES_FILE, REMOVALS_FILE, STATS_FILE])}")

    defined = {row["id"] for row in nodes}
    image_refs = {f"l{k}_node": "id" for k in range(1, l_max + 1)} | {"hard_negative_nodes": "ids",
                                                                      "fallback_negative_nodes": "ids"}
    seen: dict[str, str] = {}
    for split, rows in by_split.items():
        path = directory / SPLIT_FILES[split]
        _check_references(path, rows, "image_id", image_refs, defined)
        for n, row in enumerate(rows):
            if row["split"] != split:
                raise ExportError(f"{path}: row {n} (image {row['image_id']!r}) has split {row['split']!r} in the "
                                  f"{split} file; {REEXPORT}")
            if row["image_id"] in seen:
                raise ExportError(f"{path}: image {row['image_id']!r} is also in the {seen[row['image_id']]} file; "
                                  f"{REEXPORT}")
            seen[row["image_id"]] = split
    _check_references(directory / NODES_FILE, nodes, "id", {"parents": "node", "primary_parent": "id",
                                                            "hard_negatives": "node", "fallback_negatives": "node"},
                      defined)
    checked.append(f"node references: every node id of {sum(map(len, by_split.values()))} image rows and "
                   f"{len(nodes)} node rows is defined")

    magic = _magic_from_rows(directory, info, by_split, nodes, merges, removals, stats)
    checked.append("MAGIC invariants (levels, acyclicity, one l1 node per image, counts, symmetric negatives)")
    _check_rows_agree(directory, magic, by_split, nodes)
    checked.append(f"each row's l1-l{l_max} names and node ids and each node's images agree with the DAG")
    _check_table1(directory, info, magic)
    checked.append("Table 1 in the card equals Table 1 recomputed from the tables")
    rows = sorted((r for rows in by_split.values() for r in rows), key=lambda r: r["source_index"])
    return MagicExport(directory=directory, source=source or str(directory), card=meta, magic=magic, rows=rows,
                       checked=checked)


def _magic_from_rows(directory: Path, info: dict, by_split: dict[str, list[dict]], node_rows: list[dict],
                     merges: list[dict], removals: list[dict], stats: dict) -> MagicFile:
    """The MagicFile the tables describe, validated (schema and invariants)."""
    try:
        nodes = {}
        for r in sorted(node_rows, key=lambda r: r["id"]):
            negatives = r["hard_negatives"] + r["fallback_negatives"]
            nodes[r["id"]] = Node(
                id=r["id"], level=r["level"], name=r["name"], parents={p["node"]: p["images"] for p in r["parents"]},
                primary_parent=r["primary_parent"], n_images=r["n_images"],
                generalized_captions=r["generalized_captions"],
                hard_negatives=[m["node"] for m in r["hard_negatives"]],
                fallback_negatives=[m["node"] for m in r["fallback_negatives"]],
                negative_similarity={m["node"]: m["similarity"] for m in negatives}, merged_from=r["merged_from"],
                generalized_fallback=r["generalized_fallback"])
        rows = sorted((r for rows in by_split.values() for r in rows), key=lambda r: (r["l1_node"], r["image_id"]))
        images = {r["image_id"]: ImageRecord(id=r["image_id"], node=r["l1_node"], captions=r["captions"],
                                             split=r["split"], raw_chain=r["raw_chain"],
                                             generalized_captions=r["generalized_captions"],
                                             generalized_fallback=r["generalized_fallback"]) for r in rows}
        magic = MagicFile(schema_version=info["magic_schema_version"], l_max=info["l_max"],
                          split_kind=info["split_kind"], generalize=info["generalize"], nodes=nodes, images=images,
                          merges=[MergeRecord(**m) for m in merges], removals=[RemovalRecord(**r) for r in removals],
                          skipped=info["skipped"] or {}, stats=stats["stats"], provenance=stats["provenance"])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ExportError(f"{directory}: the tables do not make a valid magic.json ({where}: {first['msg']}; "
                          f"{exc.error_count()} problems); {REEXPORT}") from None
    try:
        check_invariants(magic)
    except MagicInvariantError as exc:
        raise ExportError(f"{directory}: the tables break MAGIC's rules: {exc}") from None
    return magic


def _check_rows_agree(directory: Path, magic: MagicFile, by_split: dict[str, list[dict]], nodes: list[dict]) -> None:
    """The redundant columns (chain names and ids per image, image ids per node) must say what the DAG says."""
    for split, rows in by_split.items():
        for n, row in enumerate(rows):
            chain = magic.chain(row["image_id"])
            names = [magic.nodes[c].name for c in chain]
            given = [row[f"l{k}_node"] for k in range(1, magic.l_max + 1)]
            given_names = [row[f"l{k}"] for k in range(1, magic.l_max + 1)]
            if given != chain or given_names != names:
                raise ExportError(f"{directory / SPLIT_FILES[split]}: row {n} (image {row['image_id']!r}) has the "
                                  f"chain {given} {given_names}, but the nodes table gives {chain} {names}; "
                                  f"{REEXPORT}")
    for n, row in enumerate(nodes):
        if row["image_ids"] != magic.images_of(row["id"]):
            raise ExportError(f"{directory / NODES_FILE}: row {n} (node {row['id']!r}) lists {len(row['image_ids'])} "
                              f"images, but {len(magic.images_of(row['id']))} images lie under it; {REEXPORT}")


def _check_table1(directory: Path, info: dict, magic: MagicFile) -> None:
    """The card's Table 1 must be what the tables give (a card edited by hand, or of another export, is refused)."""
    recomputed = magic.model_copy()
    recomputed.stats = compute_stats(magic)
    ours = {str(k): (v.item() if hasattr(v, "item") else v) for k, v in table1(recomputed)["ours"].items()}
    card = info.get("table1") or {}
    differ = {k: (card.get(k), v) for k, v in ours.items() if card.get(k) != v}
    if differ:
        raise ExportError(f"{directory / CARD_FILE}: Table 1 in the card differs from the tables (statistic: (card, "
                          f"tables)) {differ}; {REEXPORT}")


# ------------------------------------------------------------------------------------------- using
def open_export(params: Params) -> MagicExport:
    """The export named by `params.magic.source`, downloaded if it is a Hub id, checked, with a matching l_max."""
    source = params.magic.source
    if source == "build":
        raise ValueError("magic.source is 'build': this run builds MAGIC itself (notebooks 02-03); set magic.source "
                         "to an export folder or a Hub id to import one")
    export = read_export(resolve_source(source), source=source)
    if export.magic.l_max != params.magic.l_max:
        raise ExportError(f"{export.directory / CARD_FILE}: the export has l_max {export.magic.l_max} but the params "
                          f"say magic.l_max: {params.magic.l_max}; set magic.l_max: {export.magic.l_max}")
    return export


def captions_from_export(params: Params, export: MagicExport | None = None
                         ) -> tuple[CaptionDataset, dict[str, list[str]] | None]:
    """Notebook 01's dataset and ground truth for an imported MAGIC (see the module docstring)."""
    export = export or open_export(params)
    ids = [r["image_id"] for r in export.rows]
    captions = {r["image_id"]: list(r["captions"]) for r in export.rows}
    world = export.info["world"]
    if world is not None:
        return _rerender_world(params, export, ids, captions)
    if params.data.source == "synthetic":
        raise ValueError(f"{export.directory / CARD_FILE}: this export references {export.info['source']} images by "
                         "file name; set data.source: coco and data.coco_images to your COCO image folder")
    image_dir = params.data.coco_images if params.data.source == "coco" else params.data.hierarcaps_images
    key = "data.coco_images" if params.data.source == "coco" else "data.hierarcaps_images"
    if image_dir is None or not Path(image_dir).is_dir():
        raise FileNotFoundError(f"{key} ({image_dir}) is not a folder; set it to the folder holding the export's "
                                "images (COCO's train2017/ for MAGIC)")
    files = {r["image_id"]: Path(image_dir) / r["file_name"] for r in export.rows}
    problems = dict(zip(ids, image_problems([files[i] for i in ids])))
    unreadable = Counter(p for p in problems.values() if p)
    meta = {"image_dir": str(image_dir), "imported_from": export.source,
            "images_unreadable": dict(sorted(unreadable.items())),
            "unreadable_ids": [i for i in ids if problems[i]][:SHOWN_IDS]}
    if unreadable:
        logger.warning("MAGIC export %s: %d of %d images are missing or unreadable under %s (%s); they stay in "
                       "MAGIC and training and evaluation skip them, counted", export.source, sum(unreadable.values()),
                       len(ids), image_dir, dict(unreadable))
    dataset = CaptionDataset(source=export.info["source"], image_ids=ids, captions=captions, image_files=files,
                             meta=meta)
    return dataset, None


def _rerender_world(params: Params, export: MagicExport, ids: list[str], captions: dict[str, list[str]]
                    ) -> tuple[CaptionDataset, dict[str, list[str]]]:
    """The synthetic world of the export rendered again from its parameters and seed, restricted to its images,
    checked against the exported captions and ground truth."""
    world_params = export.info["world"]
    if params.data.source != "synthetic":
        raise ValueError(f"{export.directory / CARD_FILE}: this export is a synthetic world (re-rendered from its "
                         f"seed); set data.source: synthetic (data.source is {params.data.source!r})")
    absent = [k for k in WORLD_KEYS if k not in world_params]
    if absent:
        raise ExportError(f"{export.directory / CARD_FILE}: cglib_magic.world lacks {absent}; {REEXPORT}")
    world = make_world(**{k: world_params[k] for k in WORLD_KEYS})
    unknown = [i for i in ids if i not in world.ground_truth]
    if unknown:
        raise ExportError(f"{export.directory}: {len(unknown)} images are not in the re-rendered world (first: "
                          f"{unknown[0]}); the export's world parameters do not describe its images: {REEXPORT}")
    for row in export.rows:
        image_id = row["image_id"]
        if world.dataset.captions[image_id] != captions[image_id] or (
                row["ground_truth"] is not None and list(row["ground_truth"]) != world.ground_truth[image_id]):
            raise ExportError(f"{export.directory}: image {image_id!r} re-rendered from the world's seed has other "
                              "captions or ground truth than the export (another version of the synthetic world, "
                              f"cglib {export.info['built_by'].get('cglib_version')}); use that cglib, or {REEXPORT}")
    dataset = world.dataset.subset(ids)
    dataset.meta = {**world.dataset.meta, "imported_from": export.source}
    return dataset, {i: world.ground_truth[i] for i in ids}


def imported_magic(export: MagicExport, params: Params) -> MagicFile:
    """The export's MAGIC for this run: the same content, with this run's provenance (the export's kept inside)."""
    magic = export.magic.model_copy(deep=True)
    magic.provenance = provenance(params, stage="magic", imported_from=export.source,
                                  export_directory=str(export.directory), export_provenance=export.magic.provenance)
    return magic
