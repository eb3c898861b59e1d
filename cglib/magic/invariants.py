"""The rules every `magic.json` obeys, checked on every build and every load (`check_invariants`).

Structure: node keys are `l{level}:{name}`; levels lie in 1..l_max; edges go only from level k to k+1; every
node below l_max has a parent and l_max nodes have none; the graph is acyclic (networkx); edge counts are >= 1;
`primary_parent` is the most supported parent (ties: smallest id). Images: each is attached to exactly one
existing l1 node and has captions; every node's `n_images` equals the images under it along primary chains; an
l1 node's parent counts sum to at most its images. Negatives: same level, not the node itself, no duplicates,
threshold negatives symmetric, fallbacks disjoint from them, a similarity for each. Concept split: each l1
node's images all in one split. Logs: merged and removed nodes are gone, removed images are gone.
"""

from __future__ import annotations

from collections import Counter

import networkx as nx

from cglib.magic.dag import choose_primary, dag_problems
from cglib.magic.schema import MagicFile, node_id

MAX_SHOWN = 8


class MagicInvariantError(ValueError):
    """A MAGIC file breaks a structural rule; the message lists the problems."""


def to_digraph(magic: MagicFile) -> nx.DiGraph:
    """The concept hierarchy as a networkx DiGraph (child -> parent, `count` on edges)."""
    graph = nx.DiGraph()
    for n in magic.nodes.values():
        graph.add_node(n.id, level=n.level, name=n.name)
    for n in magic.nodes.values():
        for parent, count in n.parents.items():
            if parent in magic.nodes:
                graph.add_edge(n.id, parent, count=count)
    return graph


def invariant_problems(magic: MagicFile) -> list[str]:
    """Every broken rule, as one readable line each (empty when the file is sound)."""
    problems: list[str] = []
    nodes = magic.nodes
    for key, n in nodes.items():
        if key != n.id or n.id != node_id(n.level, n.name):
            problems.append(f"node key {key!r} must equal its id {n.id!r} and 'l{{level}}:{{name}}'")
        for parent, count in n.parents.items():
            if parent not in nodes:
                problems.append(f"node {key}: parent {parent} does not exist")
            if count < 1:
                problems.append(f"node {key}: edge to {parent} has count {count} (must be >= 1)")
        if n.primary_parent != choose_primary(n.parents):
            problems.append(f"node {key}: primary_parent {n.primary_parent!r} is not its most supported parent "
                            f"{choose_primary(n.parents)!r} (ties: smallest id)")
    if problems:  # the graph checks below need existing parents and consistent ids
        return problems
    problems += dag_problems(to_digraph(magic), magic.l_max)
    if problems:
        return problems

    # images: one existing l1 node each, captions present
    for key, rec in magic.images.items():
        if key != rec.id:
            problems.append(f"image key {key!r} differs from its id {rec.id!r}")
        node = nodes.get(rec.node)
        if node is None or node.level != 1:
            problems.append(f"image {key} is attached to {rec.node!r}, which is not an l1 node")
        if not rec.captions or any(not c.strip() for c in rec.captions):
            problems.append(f"image {key} has no captions or an empty caption")
    if problems:
        return problems

    # counts along primary chains
    counts = Counter(rec.node for rec in magic.images.values())
    under = {n: counts.get(n, 0) for n in nodes}
    for level in range(1, magic.l_max):
        for n in magic.nodes_at(level):
            if n.primary_parent is not None:
                under[n.primary_parent] += under[n.id]
    for key, n in nodes.items():
        if n.n_images != under[key]:
            problems.append(f"node {key}: n_images {n.n_images} but {under[key]} images lie under it")
        if n.level == 1 and sum(n.parents.values()) > n.n_images:
            problems.append(f"node {key}: parent edge counts sum to {sum(n.parents.values())}, more than its "
                            f"{n.n_images} images")

    # negatives
    for key, n in nodes.items():
        both = n.hard_negatives + n.fallback_negatives
        if len(set(both)) != len(both):
            problems.append(f"node {key}: duplicate negatives or a negative both hard and fallback")
        for other in both:
            if other == key or other not in nodes or nodes[other].level != n.level:
                problems.append(f"node {key}: negative {other!r} is not another node of level {n.level}")
        for other in n.hard_negatives:
            if other in nodes and key not in nodes[other].hard_negatives:
                problems.append(f"node {key}: hard negative {other} does not have {key} as hard negative")
        if set(n.negative_similarity) != set(both):
            problems.append(f"node {key}: negative_similarity keys differ from its negatives")

    if magic.split_kind == "concept":
        splits: dict[str, set[str]] = {}
        for rec in magic.images.values():
            splits.setdefault(rec.node, set()).add(rec.split)
        problems += [f"concept split: l1 node {k} has images in both splits" for k, s in splits.items() if len(s) > 1]

    for m in magic.merges:
        if m.source in nodes:
            problems.append(f"merge log: {m.source} was merged into {m.target} but is still a node")
    for r in magic.removals:
        if r.node in nodes:
            problems.append(f"removal log: {r.node} was removed but is still a node")
        problems += [f"removal log: image {i} of removed {r.node} is still an image" for i in r.image_ids
                     if i in magic.images]
    return problems


def check_invariants(magic: MagicFile) -> None:
    """Raise MagicInvariantError listing the broken rules (see the module docstring)."""
    problems = invariant_problems(magic)
    if problems:
        shown = "; ".join(problems[:MAX_SHOWN])
        more = f" (and {len(problems) - MAX_SHOWN} more)" if len(problems) > MAX_SHOWN else ""
        raise MagicInvariantError(f"MAGIC data breaks {len(problems)} rule(s): {shown}{more}. A file from "
                                  "disk was edited or written by other code: rebuild it with notebook 03_magic_dag")
