"""MAGIC as a shareable dataset: a run's `magic.json` written in the Hugging Face `datasets` layout.

`export_magic(RUN_DIR, DEST)` (the CLI's `cglib export-magic`) writes:

    README.md                            dataset card: YAML metadata (license, configs, provenance, Table 1) + text
    data/train-00000-of-00001.parquet    one row per image of each split (config `default`)
    data/test-00000-of-00001.parquet
    nodes/nodes-00000-of-00001.parquet   one row per concept node (config `nodes`)
    merges/merges-00000-of-00001.parquet the merge log (config `merges`)
    removals/removals-00000-of-00001.parquet the removal log (config `removals`)
    stats.json                           magic.json's `stats` and `provenance` blocks, verbatim

`datasets.load_dataset(DEST)` gives the train and test splits, `load_dataset(DEST, "nodes")` the nodes. Images
are never copied: real images are referenced by COCO id and file name; a synthetic world is re-rendered from the
world's parameters and seed, which the card carries. `cglib.magic.hf_import` reads an export back
(`magic.source` in the params); every column the import needs is written here, so an export holds the whole
`magic.json` and a round trip gives the same file.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from cglib.data.dataset import CaptionDataset, load_ground_truth
from cglib.magic.files import load_magic
from cglib.magic.schema import MagicFile
from cglib.magic.stats import table1
from cglib.run import output_path

EXPORT_FORMAT_VERSION = 1
CARD_FILE = "README.md"
STATS_FILE = "stats.json"
SPLITS = ("train", "test")
SPLIT_FILES = {split: f"data/{split}-00000-of-00001.parquet" for split in SPLITS}
NODES_FILE = "nodes/nodes-00000-of-00001.parquet"
MERGES_FILE = "merges/merges-00000-of-00001.parquet"
REMOVALS_FILE = "removals/removals-00000-of-00001.parquet"
# the world parameters a synthetic export carries (keys of make_world, as recorded in the dataset's meta)
WORLD_KEYS = ("seed", "images_per_concept", "image_size", "captions_per_image", "min_objects", "max_objects", "levels")

_strings = pa.list_(pa.string())
_negatives = pa.list_(pa.struct([("node", pa.string()), ("similarity", pa.float64())]))


def image_schema(l_max: int) -> pa.Schema:
    """Columns of a split file: one row per image."""
    chain = [pa.field(f"l{k}", pa.string()) for k in range(1, l_max + 1)]
    chain_ids = [pa.field(f"l{k}_node", pa.string()) for k in range(1, l_max + 1)]
    return pa.schema([
        ("image_id", pa.string()), ("coco_id", pa.int64()), ("file_name", pa.string()),
        ("source_index", pa.int64()), ("split", pa.string()), ("captions", _strings),
        ("generalized_captions", _strings), ("generalized_fallback", pa.bool_()), *chain, *chain_ids,
        ("hard_negative_nodes", _strings), ("fallback_negative_nodes", _strings), ("raw_chain", _strings),
        ("ground_truth", _strings)])


NODE_SCHEMA = pa.schema([
    ("id", pa.string()), ("level", pa.int32()), ("name", pa.string()),
    ("parents", pa.list_(pa.struct([("node", pa.string()), ("images", pa.int64())]))),
    ("primary_parent", pa.string()), ("n_images", pa.int64()), ("image_ids", _strings), ("merged_from", _strings),
    ("hard_negatives", _negatives), ("fallback_negatives", _negatives), ("generalized_captions", _strings),
    ("generalized_fallback", pa.bool_())])
MERGE_SCHEMA = pa.schema([("level", pa.int32()), ("source", pa.string()), ("target", pa.string()),
                          ("similarity", pa.float64()), ("n_images", pa.int64()), ("round", pa.int32())])
REMOVAL_SCHEMA = pa.schema([("level", pa.int32()), ("node", pa.string()), ("n_images", pa.int64()),
                            ("best_match", pa.string()), ("similarity", pa.float64()), ("image_ids", _strings)])


def _file_name(dataset: CaptionDataset, image_id: str) -> str | None:
    """The image's file name relative to the image folder (None for in-memory pixels)."""
    if dataset.image_files is None:
        return None
    path = Path(dataset.image_files[image_id])
    root = dataset.meta.get("image_dir")
    if root:
        try:
            return path.relative_to(root).as_posix()
        except ValueError:
            pass
    return path.name


def image_rows(magic: MagicFile, dataset: CaptionDataset, ground_truth: dict[str, list[str]] | None
               ) -> dict[str, list[dict]]:
    """Rows of each split, in the source dataset's order."""
    known = set(dataset.image_ids)
    missing = [i for i in magic.images if i not in known]
    if missing:
        raise ValueError(f"{len(missing)} MAGIC images are not in the run's captions dataset (first: {missing[0]}); "
                         "the run folder mixes two runs: re-run notebook 03_magic_dag")
    position = {image_id: n for n, image_id in enumerate(dataset.image_ids)}
    rows: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for image_id in sorted(magic.images, key=position.__getitem__):
        record = magic.images[image_id]
        chain = magic.chain(image_id)
        group = magic.nodes[record.node]
        row = {"image_id": image_id, "coco_id": int(image_id) if image_id.isdigit() else None,
               "file_name": _file_name(dataset, image_id), "source_index": position[image_id],
               "split": record.split, "captions": record.captions,
               "generalized_captions": record.generalized_captions,
               "generalized_fallback": record.generalized_fallback,
               **{f"l{k}": magic.nodes[n].name for k, n in enumerate(chain, start=1)},
               **{f"l{k}_node": n for k, n in enumerate(chain, start=1)},
               "hard_negative_nodes": group.hard_negatives, "fallback_negative_nodes": group.fallback_negatives,
               "raw_chain": record.raw_chain,
               "ground_truth": None if ground_truth is None else ground_truth.get(image_id)}
        rows[record.split].append(row)
    return rows


def node_rows(magic: MagicFile) -> list[dict]:
    """One row per node, sorted by id; negatives with their concept cosine, most similar first."""
    rows = []
    for key in sorted(magic.nodes):
        n = magic.nodes[key]
        rows.append({
            "id": n.id, "level": n.level, "name": n.name,
            "parents": [{"node": p, "images": c} for p, c in n.parents.items()],
            "primary_parent": n.primary_parent, "n_images": n.n_images, "image_ids": magic.images_of(n.id),
            "merged_from": n.merged_from,
            "hard_negatives": [{"node": m, "similarity": n.negative_similarity[m]} for m in n.hard_negatives],
            "fallback_negatives": [{"node": m, "similarity": n.negative_similarity[m]} for m in n.fallback_negatives],
            "generalized_captions": n.generalized_captions, "generalized_fallback": n.generalized_fallback})
    return rows


def _write_table(rows: list[dict], schema: pa.Schema, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), tmp)
    tmp.replace(path)


def _cglib_version() -> str | None:
    try:
        return metadata.version("cglib")
    except metadata.PackageNotFoundError:
        return None


def card_metadata(magic: MagicFile, source: str, world: dict | None, row_counts: dict[str, int]) -> dict:
    """The YAML header of the dataset card: Hub metadata, the `configs` that `load_dataset` reads, and the
    `cglib_magic` block that `cglib.magic.hf_import` reads (format, schema, provenance, parameters, Table 1)."""
    # an imported MAGIC keeps its builder's provenance inside its own: the card credits the build, not the import
    prov = magic.provenance.get("export_provenance") or magic.provenance
    params = prov.get("params") or {}
    llm, magic_params = params.get("llm") or {}, params.get("magic") or {}
    keep_llm = ("backend", "model", "base_url", "prompt_version", "generalize_image_prompt_version",
                "generalize_level_prompt_version", "temperature",
                "structured_output", "batch_api", "generalized_captions_per_node", "generalized_captions_per_image",
                "offline_method")
    ours = table1(magic)["ours"]
    n_images = sum(row_counts[s] for s in SPLITS)
    return {
        "license": "cc-by-4.0",
        "pretty_name": "MAGIC (CLEAR GLASS reproduction)",
        "language": ["en"],
        "task_categories": ["zero-shot-image-classification", "text-to-image", "image-to-text"],
        "tags": ["coco", "concept-hierarchy", "hard-negatives", "clip", "cglib"],
        "size_categories": ["n<1K" if n_images < 1_000 else "1K<n<10K" if n_images < 10_000
                            else "10K<n<100K" if n_images < 100_000 else "100K<n<1M"],
        "configs": [
            {"config_name": "default", "default": True,
             "data_files": [{"split": s, "path": SPLIT_FILES[s]} for s in SPLITS]},
            {"config_name": "nodes", "data_files": [{"split": "nodes", "path": NODES_FILE}]},
            {"config_name": "merges", "data_files": [{"split": "merges", "path": MERGES_FILE}]},
            {"config_name": "removals", "data_files": [{"split": "removals", "path": REMOVALS_FILE}]},
        ],
        "cglib_magic": {
            "format_version": EXPORT_FORMAT_VERSION, "magic_schema_version": magic.schema_version,
            "l_max": magic.l_max, "split_kind": magic.split_kind, "generalize": magic.generalize,
            "source": source, "world": world, "skipped": dict(magic.skipped), "rows": row_counts,
            "built_by": {"llm_backend": llm.get("backend"), "llm_model": llm.get("model"),
                         "prompt_version": llm.get("prompt_version"),
                         "generalize_image_prompt_version": llm.get("generalize_image_prompt_version"),
                         "generalize_level_prompt_version": llm.get("generalize_level_prompt_version"),
                         "embedder": magic_params.get("embedder"), "git_commit": prov.get("git_commit"),
                         "cglib_version": (prov.get("versions") or {}).get("cglib") or _cglib_version(),
                         "created": prov.get("created"), "run_name": (params.get("run") or {}).get("name")},
            "parameters": {"run.seed": (params.get("run") or {}).get("seed"),
                           "llm": {k: llm[k] for k in keep_llm if k in llm}, "magic": magic_params},
            "table1": {str(k): (v.item() if hasattr(v, "item") else v) for k, v in ours.items()},
        },
    }


LICENSE_NOTE = (
    "The annotations (concept chains, generalized captions, groups, hard negatives) are derived from the source "
    "captions and released under CC BY 4.0, as COCO's annotations are. **No image is included**: images are "
    "referenced by COCO image id and file name and stay under COCO's terms (the Flickr terms of use of each "
    "image); get them from cocodataset.org. A synthetic-world export holds no pixels either: cglib re-renders "
    "the scenes from the world's parameters and seed in the metadata.")


def card_text(meta: dict, magic: MagicFile) -> str:
    """The dataset card: YAML header then what it is, provenance, Table 1, files, how to load it, the license."""
    info = meta["cglib_magic"]
    built = info["built_by"]
    caption_prompt = {"image": built.get("generalize_image_prompt_version"), "group": built["prompt_version"],
                      "level": built.get("generalize_level_prompt_version")}.get(info["generalize"])
    rows = info["rows"]
    table = table1(magic).reset_index()
    table1_md = "\n".join(["| statistic | paper | ours |", "|---|---|---|",
                           *(f"| {r.statistic} | {r.paper} | {r.ours} |" for r in table.itertuples())])
    world = (f"synthetic world re-rendered from its parameters: `{json.dumps(info['world'])}`"
             if info["world"] else f"`{info['source']}` images, referenced by COCO id and file name")
    header = yaml.safe_dump(meta, sort_keys=False, allow_unicode=True, width=120)
    return f"""---
{header}---

# MAGIC (CLEAR GLASS reproduction)

Images grouped by concept chains l1-l{info['l_max']} (Suissa et al., CLEAR GLASS, Sec. 3.1, Algorithm 1): each image
has its original captions, generalized captions (LLM_gen), its chain of concepts as names and node ids, and its
group's hard-negative groups. Built by `cglib` (the CLEAR GLASS reproduction) from {world}.

- images: {rows['train']} train, {rows['test']} test ({info['split_kind']} split); nodes: {rows['nodes']};
  merges: {rows['merges']}; removals: {rows['removals']}
- generalized captions: per {info['generalize']}; magic.json schema version {info['magic_schema_version']},
  export format {info['format_version']}

## Provenance
| | |
|---|---|
| abstraction backend (LLM) | {built['llm_backend']} ({built['llm_model']}) |
| prompts | {built['prompt_version']} (chains), {caption_prompt} (LLM_gen, generalize: {info['generalize']}) |
| concept embedder | {built['embedder']} |
| git commit | {built['git_commit']} |
| cglib | {built['cglib_version']} |
| built | {built['created']} (run `{built['run_name']}`) |

The MAGIC parameters (Size_min, Sim_min, hard-negative threshold, split) are under `cglib_magic.parameters` in
the metadata above; `stats.json` holds every statistic and the full provenance (params, package versions).

## Table 1
{table1_md}

## Files and columns
- `data/{{train,test}}-*.parquet` (config `default`): `image_id`, `coco_id`, `file_name`, `source_index`,
  `split`, `captions`, `generalized_captions`, `generalized_fallback` (LLM_gen failed: original captions kept),
  `l1`..`l{info['l_max']}` (names), `l1_node`..`l{info['l_max']}_node` (node ids), `hard_negative_nodes` and
  `fallback_negative_nodes` (of the image's l1 group), `raw_chain` (the abstraction's own answer),
  `ground_truth` (synthetic world only).
- `nodes/` (config `nodes`): `id`, `level`, `name`, `parents` (node, supporting images), `primary_parent`,
  `n_images`, `image_ids`, `merged_from`, `hard_negatives` and `fallback_negatives` (node, cosine),
  `generalized_captions` (per-group mode).
- `merges/`, `removals/`: Algorithm 1's merge and removal logs. `stats.json`: statistics and provenance.

## How to load
```python
from datasets import load_dataset

magic = load_dataset("path/or/hub-id")                      # DatasetDict with train and test
nodes = load_dataset("path/or/hub-id", "nodes", split="nodes")
# or: load_dataset("parquet", data_dir="path")              # the image rows only
```
In a cglib run, set `magic.source: path/or/hub-id` in the params: notebooks 02-03 then check and show this
dataset instead of calling an LLM, and training and evaluation run unchanged.

## License
{LICENSE_NOTE}
"""


def export_magic(run_dir: str | Path, dest: str | Path) -> Path:
    """Write a run's MAGIC (magic.json, captions, ground truth) to `dest` in the Hugging Face datasets layout;
    returns the card's path."""
    run_dir, dest = Path(run_dir), Path(dest)
    if not (run_dir / "params.yaml").is_file():
        raise FileNotFoundError(f"{run_dir} is not a run folder (no params.yaml); pass outputs/<run>")
    magic = load_magic(run_dir / "magic" / "magic.json")
    dataset = CaptionDataset.load(run_dir / "captions")
    ground_truth = load_ground_truth(run_dir / "captions")
    if dest.exists() and any(dest.iterdir()) and not (dest / CARD_FILE).is_file():
        raise FileExistsError(f"{dest} is a non-empty folder that holds no MAGIC export; pass a new or empty folder")
    source = dataset.source
    world = None
    if dataset.pixels is not None:
        absent = [k for k in WORLD_KEYS if k not in dataset.meta]
        if absent:
            raise ValueError(f"{run_dir / 'captions'}: in-memory images without the world parameters {absent}; "
                             "only a synthetic world can be exported without image files (re-run 01_captions)")
        world = {k: dataset.meta[k] for k in WORLD_KEYS}
    rows = image_rows(magic, dataset, ground_truth)
    for split in SPLITS:
        _write_table(rows[split], image_schema(magic.l_max), dest / SPLIT_FILES[split])
    nodes = node_rows(magic)
    _write_table(nodes, NODE_SCHEMA, dest / NODES_FILE)
    _write_table([m.model_dump() for m in magic.merges], MERGE_SCHEMA, dest / MERGES_FILE)
    _write_table([r.model_dump() for r in magic.removals], REMOVAL_SCHEMA, dest / REMOVALS_FILE)
    output_path(dest / STATS_FILE).write_text(json.dumps({"stats": magic.stats, "provenance": magic.provenance}, indent=1,
                                              ensure_ascii=False, default=str), encoding="utf-8")
    counts = {**{s: len(rows[s]) for s in SPLITS}, "nodes": len(nodes), "merges": len(magic.merges),
              "removals": len(magic.removals)}
    meta = card_metadata(magic, source, world, counts)
    card = output_path(dest / CARD_FILE)
    card.write_text(card_text(meta, magic), encoding="utf-8")
    return card


def card_head(card: str | Path, lines: int = 12) -> str:
    """The first lines of a dataset card's text after its YAML header (what the Hub shows first)."""
    text = Path(card).read_text(encoding="utf-8")
    body = text.split("\n---\n", 1)[1] if text.startswith("---\n") and "\n---\n" in text else text
    return "\n".join(body.strip().splitlines()[:lines])


