"""Is the hard-negative threshold right for the embedder? Per level, each node's nearest-neighbour cosine (its most
similar same-level node) against `magic.hard_negative_sim`, and the share of nodes with a real hard negative.

The paper's thresholds (cos > 0.85 for hard negatives, 0.9 for merges) suit an embedder whose cosines crowd near
1 (the authors import OpenAI's text-embedding-ada-002; which embedder produced the published numbers is not
known). With a sentence encoder such as MiniLM, whose cosines spread, 0.85 can leave most nodes without a hard
negative, and their batches then use fallback negatives (sampler.py). A node's nearest neighbour is read from the
DAG: its most similar hard negative, else its most similar fallback (the builder records min_hard_negatives of
them, most similar first); a node with neither is counted as unknown.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from cglib.magic.schema import MagicFile

COVERAGE_FLOOR = 1 / 3  # below this share of nodes with a real hard negative, the threshold or embedder is off


class HardNegativeCoverageWarning(UserWarning):
    """Fewer than a third of a level's nodes have a hard negative above the threshold."""


def nearest_neighbour_cosines(magic: MagicFile) -> pd.DataFrame:
    """One row per node: level, node, nn_cosine (NaN: unknown), has_hard_negative."""
    rows = []
    for node in magic.nodes.values():
        similar = node.negative_similarity
        rows.append({"level": node.level, "node": node.id,
                     "nn_cosine": max(similar.values()) if similar else float("nan"),
                     "has_hard_negative": bool(node.hard_negatives)})
    return pd.DataFrame(rows, columns=["level", "node", "nn_cosine", "has_hard_negative"]).sort_values(
        ["level", "node"], ignore_index=True)


def level_thresholds(magic: MagicFile, threshold: float | str | None = None) -> dict[int, float]:
    """The hard-negative threshold of each level: the one the build recorded (stats.json's settings; a
    `calibrated` threshold differs per level), else `threshold` for every level."""
    recorded = magic.stats.get("settings", {}).get("hard_negative_sim_by_level")
    levels = sorted({n.level for n in magic.nodes.values()})
    if recorded:
        return {k: float(recorded[f"l{k}"]) for k in levels if f"l{k}" in recorded}
    if isinstance(threshold, (int, float)):
        return dict.fromkeys(levels, float(threshold))
    raise ValueError("this magic.json records no per-level thresholds (built before hard_negative_sim: "
                     "calibrated existed); pass the numeric magic.hard_negative_sim it was built with")


def hard_negative_coverage(magic: MagicFile, threshold: float | str | None = None) -> pd.DataFrame:
    """Per level: nodes, those with a hard negative and their share, the nearest-neighbour cosines' quartiles, the
    level's threshold (`level_thresholds`), and the threshold at which a third of the nodes would have one (the
    2/3 quantile of their nearest neighbours)."""
    table = nearest_neighbour_cosines(magic)
    thresholds = level_thresholds(magic, threshold)
    rows = []
    for level, part in table.groupby("level", sort=True):
        threshold = thresholds[level]
        cos = part["nn_cosine"].dropna().to_numpy(float)
        quartiles = np.quantile(cos, [0.25, 0.5, 0.75]) if cos.size else [float("nan")] * 3
        rows.append({"level": f"l{level}", "nodes": len(part), "with_hard_negative": int(part["has_hard_negative"].sum()),
                     "share": float(part["has_hard_negative"].mean()) if len(part) else float("nan"),
                     "nn_unknown": int(part["nn_cosine"].isna().sum()), "nn_q25": quartiles[0],
                     "nn_median": quartiles[1], "nn_q75": quartiles[2], "threshold": threshold,
                     "threshold_for_a_third": float(np.quantile(cos, 1 - COVERAGE_FLOOR)) if cos.size else float("nan")})
    return pd.DataFrame(rows).set_index("level")


def coverage_warnings(coverage: pd.DataFrame, embedder: str) -> list[str]:
    """A sentence per level (with more than one node) where fewer than a third have a real hard negative, naming
    the fix."""
    out = []
    for level, r in coverage.iterrows():
        if r["nodes"] < 2 or r["share"] >= COVERAGE_FLOOR:
            continue
        out.append(f"{level}: only {int(r['with_hard_negative'])} of {int(r['nodes'])} nodes ({100 * r['share']:.0f}%) have a hard "
                   f"negative above magic.hard_negative_sim = {r['threshold']:.2f}; the others train against fallback "
                   f"negatives. The median nearest-neighbour cosine is {r['nn_median']:.2f} with embedder {embedder}: "
                   f"set magic.hard_negative_sim to about {r['threshold_for_a_third']:.2f} (a third of the nodes above "
                   "it) or lower, or use an embedder whose cosines crowd near 1 as the paper's threshold assumes "
                   "(magic.embedder)")
    return out
