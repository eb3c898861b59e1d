"""Statistics of a MAGIC dataset: the paper's Table 1 and per-level distributions, merges, removals, failures,
and the leakage of concept names into generalized captions.

Table 1 reports "images per node" without saying over which nodes; we report it over l1 nodes (the groups that
training uses) and over the nodes of all levels, side by side. Its "image-caption pairs" are counted the
paper's way: one (image, generalized caption) pair per generalized caption written for an image (with
magic.generalize: group, every image pairs with each of its node's captions); fallback copies of original
captions are not written captions and are left out (counted apart).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd

from cglib.llm.generalize_requests import mentions_concept
from cglib.magic.schema import MagicFile, node_id

# Paper, Table 1 (Suissa et al.): the MAGIC dataset built from COCO train2017.
PAPER_TABLE1 = {"image-caption pairs": 81_602, "l1 nodes": 1_071, "l2 nodes": 281, "l3 nodes": 113,
                "l4 nodes": 87, "mean images per node": 32.48}


def _distribution(values: list[int] | list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    v = np.asarray(values, dtype=np.float64)
    return {"n": int(v.size), "mean": round(float(v.mean()), 3), "min": float(v.min()),
            "p10": float(np.percentile(v, 10)), "median": float(np.median(v)), "p90": float(np.percentile(v, 90)),
            "max": float(v.max())}


def _per_level(magic: MagicFile, counter: Counter) -> dict[str, int]:
    return {f"l{level}": int(counter.get(level, 0)) for level in range(1, magic.l_max + 1)}


def compute_stats(magic: MagicFile) -> dict:
    """Counts and distributions of a built MAGIC file (JSON-ready; level keys are 'l1'..'l{l_max}')."""
    levels = range(1, magic.l_max + 1)
    n_images = len(magic.images)
    all_counts = [n.n_images for n in magic.nodes.values()]
    stats: dict = {
        "images": n_images,
        "pairs": generalized_pairs(magic),
        "pairs_fallback": generalized_pairs(magic, fallback=True),
        "original_caption_pairs": sum(len(r.captions) for r in magic.images.values()),
        "nodes_per_level": {f"l{k}": len(magic.nodes_at(k)) for k in levels},
        "mean_images_per_l1_node": round(n_images / max(1, len(magic.nodes_at(1))), 3),
        "mean_images_per_node_all_levels": round(float(np.mean(all_counts)), 3) if all_counts else 0.0,
        "images_per_node": {f"l{k}": _distribution([n.n_images for n in magic.nodes_at(k)]) for k in levels},
        "parents_per_node": {f"l{k}": _distribution([len(n.parents) for n in magic.nodes_at(k)])
                             for k in range(1, magic.l_max)},
        "multi_parent_nodes": {f"l{k}": sum(len(n.parents) > 1 for n in magic.nodes_at(k))
                               for k in range(1, magic.l_max)},
    }
    # how often an image's own chain (mapped through merges) differs from the primary chain it is filed under
    alias = {m.source: m.target for m in magic.merges}
    with_raw = [i for i, r in magic.images.items() if r.raw_chain]
    differs = Counter()
    for image_id in with_raw:
        raw = magic.images[image_id].raw_chain
        chain = magic.chain(image_id)
        for level in range(2, magic.l_max + 1):
            own = node_id(level, raw[level - 1])
            while own in alias:
                own = alias[own]
            if own != chain[level - 1]:
                differs[level] += 1
    stats["own_chain_differs_from_primary"] = {"images_with_raw_chain": len(with_raw),
                                               **{f"l{k}": differs[k] for k in range(2, magic.l_max + 1)}}
    stats["merges"] = _per_level(magic, Counter(m.level for m in magic.merges))
    stats["removals"] = _per_level(magic, Counter(r.level for r in magic.removals))
    stats["removed_images"] = sum(len(r.image_ids) for r in magic.removals)
    stats["skipped_before_dag"] = dict(magic.skipped)
    negatives: dict = {}
    for k in levels:
        nodes = magic.nodes_at(k)
        negatives[f"l{k}"] = {
            "per_node": _distribution([len(n.hard_negatives) for n in nodes]),
            "nodes_without": sum(not n.hard_negatives for n in nodes),
            "nodes_with_fallback": sum(bool(n.fallback_negatives) for n in nodes),
            "fallback_total": sum(len(n.fallback_negatives) for n in nodes),
        }
    stats["hard_negatives"] = negatives
    train, test = magic.split_ids("train"), magic.split_ids("test")
    stats["split"] = {"kind": magic.split_kind, "train_images": len(train), "test_images": len(test),
                      "train_groups": len(magic.groups("train")), "test_groups": len(magic.groups("test"))}
    stats["generalized_fallback_nodes"] = sum(n.generalized_fallback for n in magic.nodes_at(1))
    stats["generalized_fallback_images"] = sum(r.generalized_fallback for r in magic.images.values())
    stats["leakage"] = leakage(magic)
    return stats


def _pairs_unit(magic: MagicFile, image_id: str) -> tuple[list[str], bool]:
    """The generalized captions an image pairs with and whether they are fallback copies."""
    record = magic.images[image_id]
    fallback = record.generalized_fallback if magic.per_image else magic.nodes[record.node].generalized_fallback
    return magic.generalized_texts(image_id), fallback


def generalized_pairs(magic: MagicFile, fallback: bool = False) -> int:
    """(image, generalized caption) pairs: written captions (fallback=False) or fallback copies (True)."""
    total = 0
    for image_id in magic.images:
        texts, is_fallback = _pairs_unit(magic, image_id)
        total += len(texts) if is_fallback == fallback else 0
    return total


def _leak_counts(units: list[tuple[list[str], list[str]]], l_max: int) -> dict:
    """Captions of (chain names, captions) units that contain the unit's level-k name, per level and any."""
    by_level = Counter()
    units_with = Counter()
    any_level = 0
    n_captions = sum(len(caps) for _, caps in units)
    for names, caps in units:
        hit_levels: set[int] = set()
        for caption in caps:
            hits = [k for k, name in enumerate(names, start=1) if mentions_concept(caption, name)]
            by_level.update(hits)
            hit_levels.update(hits)
            any_level += bool(hits)
        units_with.update(hit_levels)
    share = (lambda k: round(k / n_captions, 4)) if n_captions else (lambda k: 0.0)
    return {"units": len(units), "captions": n_captions,
            "by_level": {f"l{k}": {"captions": by_level[k], "share": share(by_level[k]), "units": units_with[k]}
                         for k in range(1, l_max + 1)},
            "any_level": {"captions": any_level, "share": share(any_level)}}


def leakage(magic: MagicFile) -> dict:
    """Per level, how many generalized captions contain their unit's l1..l_max concept names (whole words,
    case-insensitive, singular forms): the unit is the image (magic.generalize: image; its chain) or the l1 node
    (group; the node's chain). Concept names are the evaluation queries, so every such caption lets a model
    trained on it see an evaluation string. Written captions and fallback copies (original captions) apart;
    `train`: the written captions of training images (image mode) or of nodes with training images (group)."""
    written: list[tuple[list[str], list[str]]] = []
    copies: list[tuple[list[str], list[str]]] = []
    train: list[tuple[list[str], list[str]]] = []
    if magic.per_image:
        for image_id in sorted(magic.images):
            record = magic.images[image_id]
            unit = (magic.chain_names(image_id), list(record.generalized_captions))
            (copies if record.generalized_fallback else written).append(unit)
            if record.split == "train" and not record.generalized_fallback:
                train.append(unit)
    else:
        train_groups = set(magic.groups("train"))
        for node_key in magic.groups():
            node = magic.nodes[node_key]
            names = [magic.nodes[magic.ancestor(node_key, k)].name for k in range(1, magic.l_max + 1)]
            unit = (names, list(node.generalized_captions))
            (copies if node.generalized_fallback else written).append(unit)
            if node_key in train_groups and not node.generalized_fallback:
                train.append(unit)
    return {"unit": "image" if magic.per_image else "l1 node",
            "written": _leak_counts(written, magic.l_max), "train": _leak_counts(train, magic.l_max),
            "fallback": _leak_counts(copies, magic.l_max)}


def leakage_table(magic: MagicFile) -> pd.DataFrame:
    """Per level: generalized captions (written, and of training units) containing their unit's concept name at
    that level, with shares, and the same count among fallback copies of original captions."""
    leak = magic.stats.get("leakage") or leakage(magic)
    def pick(part: str, key: str) -> dict:
        block = leak[part]
        return block["any_level"] if key == "any" else block["by_level"][key]

    rows = []
    for key in [*(f"l{k}" for k in range(1, magic.l_max + 1)), "any"]:
        rows.append({"level": key, "written captions naming it": pick("written", key)["captions"],
                     "share of written": pick("written", key)["share"],
                     "training captions naming it": pick("train", key)["captions"],
                     "share of training": pick("train", key)["share"],
                     "fallback copies naming it": pick("fallback", key)["captions"]})
    table = pd.DataFrame(rows).set_index("level")
    table.attrs["note"] = (f"unit: {leak['unit']}; {leak['written']['captions']} written captions, "
                           f"{leak['train']['captions']} of training units, {leak['fallback']['captions']} "
                           "fallback copies")
    return table


def table1(magic: MagicFile) -> pd.DataFrame:
    """The paper's Table 1 beside ours (extra levels beyond l4 are listed with no paper value)."""
    stats = magic.stats if magic.stats.get("nodes_per_level") else compute_stats(magic)
    rows = [("image-caption pairs", stats["pairs"]),
            *[(f"l{k} nodes", stats["nodes_per_level"][f"l{k}"]) for k in range(1, magic.l_max + 1)],
            ("mean images per node", stats["mean_images_per_l1_node"]),
            ("mean images per node (all levels)", stats["mean_images_per_node_all_levels"])]
    notes = {"mean images per node": "ours: per l1 node; the paper does not say over which nodes",
             "image-caption pairs": f"(image, generalized caption) pairs, generalize: {magic.generalize}; "
                                    f"{stats.get('pairs_fallback', 0)} fallback pairs left out"}
    return pd.DataFrame([{"statistic": name, "paper": PAPER_TABLE1.get(name, ""), "ours": value,
                          "note": notes.get(name, "")} for name, value in rows], dtype=object).set_index("statistic")


def level_table(magic: MagicFile) -> pd.DataFrame:
    """Per level: nodes, images per node (mean, median, min, max), multi-parent nodes, merges, removals."""
    stats = magic.stats if magic.stats.get("images_per_node") else compute_stats(magic)
    rows = []
    for k in range(1, magic.l_max + 1):
        key = f"l{k}"
        dist = stats["images_per_node"][key]
        rows.append({"level": key, "nodes": stats["nodes_per_level"][key], "mean images": dist.get("mean"),
                     "median": dist.get("median"), "min": dist.get("min"), "max": dist.get("max"),
                     "multi-parent nodes": stats["multi_parent_nodes"].get(key, 0),
                     "merges": stats["merges"][key], "removals": stats["removals"][key],
                     "hard negatives per node": stats["hard_negatives"][key]["per_node"].get("mean")})
    return pd.DataFrame(rows).set_index("level")
