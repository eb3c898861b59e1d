"""Algorithm 1 end to end: chains -> concept DAG -> merge/remove -> split -> hard negatives -> LLM_gen -> stats.

LLM_gen is per image by default (magic.generalize: image) or per l1 node (group); see generalized_captions.py.

`build_magic(dataset, chains, params)` returns a validated `MagicFile`; `save_outputs` writes magic.json,
magic.graphml and stats.json into the `magic` stage folder. The order matters: the split comes before LLM_gen
so that generalized captions can be written from training images only (see generalized_captions.py).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path

from cglib.config import Params
from cglib.data.dataset import CaptionDataset
from cglib.llm import generalize_groups
from cglib.magic.dag import ConceptDAG
from cglib.magic.embedders import Embedder, embed_names, make_embedder
from cglib.magic.export import write_graphml
from cglib.magic.files import save_magic
from cglib.magic.generalized_captions import Generalizer, add_generalized_captions
from cglib.magic.invariants import check_invariants
from cglib.magic.merge import merge_and_remove
from cglib.magic.negatives import attach_negatives, negative_settings
from cglib.magic.schema import SCHEMA_VERSION, ImageRecord, MagicFile, Node
from cglib.magic.split import split_images
from cglib.magic.stats import compute_stats
from cglib.run import provenance, write_json

logger = logging.getLogger(__name__)

SKIP_NO_CHAIN = "no chain from the abstraction (failed or missing)"
SKIP_UNKNOWN = "chain of an image that is not in the dataset"
SKIP_LENGTH = "chain length differs from magic.l_max"
SKIP_EMPTY = "empty concept name in the chain"


def align_chains(dataset: CaptionDataset, chains: dict[str, list[str]], l_max: int
                 ) -> tuple[dict[str, list[str]], Counter]:
    """Chains usable for the DAG (stripped names, exactly l_max each, images of the dataset) and skip counts."""
    known = set(dataset.image_ids)
    skipped: Counter = Counter()
    usable: dict[str, list[str]] = {}
    lengths: Counter = Counter()
    for image_id, names in chains.items():
        if image_id not in known:
            skipped[SKIP_UNKNOWN] += 1
            continue
        names = [str(n).strip() for n in names]
        lengths[len(names)] += 1
        if len(names) != l_max:
            skipped[SKIP_LENGTH] += 1
        elif not all(names):
            skipped[SKIP_EMPTY] += 1
        else:
            usable[image_id] = names
    skipped[SKIP_NO_CHAIN] += sum(1 for i in dataset.image_ids if i not in chains)
    if not usable:
        detail = (f"chain lengths seen: {dict(lengths)} but magic.l_max is {l_max}; set magic.l_max to the "
                  "abstraction's number of levels or rerun 02_abstraction" if skipped[SKIP_LENGTH]
                  else f"skipped: {dict(+skipped)}; check that the chains belong to this dataset")
        raise ValueError(f"no usable chain for the {len(dataset)} images: {detail}")
    return usable, +skipped


def _default_generalizer() -> Generalizer:
    return generalize_groups


def build_magic(dataset: CaptionDataset, chains: dict[str, list[str]], params: Params,
                run_dir: str | Path | None = None, generalizer: Generalizer | None = None,
                embedder: Embedder | None = None, progress: bool = True) -> MagicFile:
    """Build the MAGIC dataset (Algorithm 1) from abstraction chains; see the module docstring for the steps."""
    m = params.magic
    if generalizer is None and run_dir is None:
        raise ValueError("build_magic needs run_dir with the default generalizer (the abstraction engine keeps its "
                         "cache and generalized.jsonl there); pass run_dir=run.dir")
    timing: dict[str, float] = {}
    t = time.perf_counter()

    usable, skipped = align_chains(dataset, chains, m.l_max)
    dag = ConceptDAG.from_chains(usable, m.l_max)
    timing["dag"] = time.perf_counter() - t

    t = time.perf_counter()
    embed = embedder or make_embedder(params)
    names = [dag.name(n) for n in dag.graph.nodes]
    by_name = embed_names(embed, names)
    vectors = {n: by_name[dag.name(n)] for n in dag.graph.nodes}
    timing["embed"] = time.perf_counter() - t

    t = time.perf_counter()
    merges, removals = merge_and_remove(dag, vectors, m.size_min, m.sim_min)
    if dag.n_images == 0:
        raise ValueError(f"every image was removed: no node reached magic.size_min={m.size_min} images and no "
                         f"similar node reached magic.sim_min={m.sim_min}; lower them or use more images")
    timing["merge"] = time.perf_counter() - t

    t = time.perf_counter()
    split = split_images(dag.images, m.split, m.test_fraction, params.run.seed)
    counts = dag.image_counts()
    nodes = {}
    for n in sorted(dag.graph.nodes):
        nodes[n] = Node(id=n, level=dag.level(n), name=dag.name(n), parents=dag.parents(n),
                        primary_parent=dag.primary_parent(n), n_images=counts[n],
                        merged_from=sorted(dag.graph.nodes[n]["merged_from"]))
    searches = attach_negatives(nodes, vectors, m, threads=params.run.threads or None)
    images = {i: ImageRecord(id=i, node=l1, captions=list(dataset.captions[i]), split=split[i],
                             raw_chain=usable[i])
              for l1, ids in sorted(dag.images.items()) for i in sorted(ids)}
    magic = MagicFile(schema_version=SCHEMA_VERSION, l_max=m.l_max, split_kind=m.split, nodes=nodes, images=images,
                      merges=merges, removals=removals, skipped=dict(sorted(skipped.items())))
    check_invariants(magic)
    timing["split_negatives"] = time.perf_counter() - t

    t = time.perf_counter()
    gen = add_generalized_captions(magic, generalizer or _default_generalizer(), params,
                                   Path(run_dir) if run_dir else None, progress=progress)
    timing["generalize"] = time.perf_counter() - t

    t = time.perf_counter()
    magic.stats = compute_stats(magic)
    magic.stats["generalization"] = gen
    magic.stats["settings"] = {"size_min": m.size_min, "sim_min": m.sim_min, "hard_negative_sim": m.hard_negative_sim,
                               **negative_settings(searches, m),
                               "min_hard_negatives": m.min_hard_negatives, "max_hard_negatives": m.max_hard_negatives,
                               "embedder": m.embedder,
                               "embedder_model": m.embedder_model, "test_fraction": m.test_fraction,
                               "seed": params.run.seed}
    check_invariants(magic)
    timing["stats"] = time.perf_counter() - t
    magic.provenance = provenance(params, stage="magic", chains=len(chains), dataset_images=len(dataset),
                                  timing_s={k: round(v, 3) for k, v in timing.items()})
    logger.info("MAGIC: %d images, nodes per level %s, %d merges, %d removals, %d generalization fallbacks",
                len(images), magic.stats["nodes_per_level"], len(merges), len(removals), gen["fallback_to_original"])
    return magic


def save_outputs(magic: MagicFile, directory: str | Path) -> dict[str, Path]:
    """Write magic.json, magic.graphml and stats.json (stats + provenance) into `directory`."""
    directory = Path(directory)
    return {"magic": save_magic(magic, directory / "magic.json"),
            "graphml": write_graphml(magic, directory / "magic.graphml"),
            "stats": write_json(directory / "stats.json", {"stats": magic.stats, "provenance": magic.provenance})}
