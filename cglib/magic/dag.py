"""The concept DAG of Algorithm 1: one node per (level, concept name), edges child -> parent from level k to k+1.

Every image's chain l1..l_max adds one count to each of its edges, so an edge's `count` is the number of chains
(images) that support it. Images disagree: a node may have several parents. The most supported parent is the
node's *primary* parent (ties: the smallest node id, so the choice never depends on input order); primary
parents define each image's chain in `magic.json`, and the other parents stay in the file with their counts.
Edge counts are evidence from every chain the abstraction produced: removing images later does not lower them,
so a node never loses a parent because images below it were removed.

The graph is a `networkx.DiGraph`; `check()` verifies levels and acyclicity after every operation.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import networkx as nx

from cglib.magic.schema import node_id


class DagError(ValueError):
    """The concept graph broke a structural rule (level order, cycle, missing parent)."""


def choose_primary(parents: dict[str, int]) -> str | None:
    """The most supported parent; ties go to the smallest id (deterministic); None without parents."""
    if not parents:
        return None
    return min(parents, key=lambda p: (-parents[p], p))


class ConceptDAG:
    """Concept nodes keyed `l{level}:{name}`, child -> parent edges with image counts, images on l1 nodes."""

    def __init__(self, l_max: int) -> None:
        if l_max < 1:
            raise ValueError(f"l_max must be >= 1, got {l_max}")
        self.l_max = l_max
        self.graph = nx.DiGraph()
        self.images: dict[str, list[str]] = {}  # l1 node -> image ids (in insertion order)
        self.alias: dict[str, str | None] = {}  # merged node -> target, removed node -> None
        self._levels: dict[int, set[str]] = {k: set() for k in range(1, l_max + 1)}  # level -> alive node ids

    # ------------------------------------------------------------------------------------------ building
    @classmethod
    def from_chains(cls, chains: dict[str, list[str]], l_max: int) -> ConceptDAG:
        """Build from image id -> concept names l1..l_max (each chain must have exactly l_max names)."""
        dag = cls(l_max)
        for image_id in sorted(chains):
            dag.add_chain(image_id, chains[image_id])
        dag.check()
        return dag

    def add_chain(self, image_id: str, names: list[str]) -> None:
        """Attach one image to its l1 node and count each edge of its chain."""
        if len(names) != self.l_max:
            raise DagError(f"image {image_id}: chain has {len(names)} names, expected l_max={self.l_max}")
        ids = [node_id(level, name) for level, name in enumerate(names, start=1)]
        for level, (nid, name) in enumerate(zip(ids, names), start=1):
            if nid not in self.graph:
                self.graph.add_node(nid, level=level, name=name, merged_from=[])
                self._levels[level].add(nid)
        for child, parent in itertools.pairwise(ids):
            if self.graph.has_edge(child, parent):
                self.graph[child][parent]["count"] += 1
            else:
                self.graph.add_edge(child, parent, count=1)
        self.images.setdefault(ids[0], []).append(image_id)

    # ------------------------------------------------------------------------------------------ queries
    def level(self, node: str) -> int:
        return self.graph.nodes[node]["level"]

    def name(self, node: str) -> str:
        return self.graph.nodes[node]["name"]

    def nodes_at(self, level: int) -> list[str]:
        """Node ids of one level, sorted."""
        return sorted(self._levels.get(level, ()))

    def parents(self, node: str) -> dict[str, int]:
        """Parent id -> supporting images."""
        return {p: d["count"] for p, d in self.graph.succ[node].items()}

    def children(self, node: str) -> dict[str, int]:
        """Child id -> supporting images."""
        return {c: d["count"] for c, d in self.graph.pred[node].items()}

    def primary_parent(self, node: str) -> str | None:
        """The most supported parent (ties: smallest id)."""
        return choose_primary(self.parents(node))

    def ancestor(self, node: str, level: int) -> str:
        """Ancestor at `level` along primary parents."""
        while self.level(node) < level:
            parent = self.primary_parent(node)
            if parent is None:
                raise DagError(f"node {node} has no parent below level {level}")
            node = parent
        return node

    def image_counts(self, up_to: int | None = None) -> dict[str, int]:
        """Images under every node (l1: attached; higher: through primary parents), levels 1..up_to."""
        top = self.l_max if up_to is None else up_to
        counts = {n: len(self.images.get(n, ())) for n in self.nodes_at(1)}
        for level in range(1, top):
            above = dict.fromkeys(self.nodes_at(level + 1), 0)
            for n in self.nodes_at(level):
                parent = self.primary_parent(n)
                if parent is not None:
                    above[parent] += counts[n]
            counts.update(above)
        return counts

    def resolve(self, node: str) -> str | None:
        """Where a node went: itself if alive, its merge target (followed), or None if removed."""
        while node not in self.graph:
            node = self.alias.get(node)
            if node is None:
                return None
        return node

    @property
    def n_images(self) -> int:
        return sum(len(v) for v in self.images.values())

    # ---------------------------------------------------------------------------------------- operations
    def merge(self, source: str, target: str) -> None:
        """Fold `source` into `target` (same level): its images, child edges and parent edges add up."""
        if source == target or self.level(source) != self.level(target):
            raise DagError(f"cannot merge {source} into {target}: need two distinct nodes of one level")
        for child, count in self.children(source).items():
            self._add_count(child, target, count)
        for parent, count in self.parents(source).items():
            self._add_count(target, parent, count)
        if source in self.images:
            self.images.setdefault(target, []).extend(self.images.pop(source))
        self.graph.nodes[target]["merged_from"] += [source, *self.graph.nodes[source]["merged_from"]]
        self.graph.remove_node(source)
        self._levels[self.level(target)].discard(source)
        self.alias[source] = target

    def remove(self, node: str) -> list[str]:
        """Delete a node; returns the image ids that leave the dataset (l1 only).

        Children that had `node` as a minority parent just lose that edge. A child whose only parent it was
        would be cut off from the top level: that is refused (the merge loop never asks for it, see merge.py).
        """
        for child in self.children(node):
            if len(self.graph.succ[child]) == 1:
                raise DagError(f"removing {node} would leave {child} without a parent")
        removed = self.images.pop(node, [])
        self._levels[self.level(node)].discard(node)
        self.graph.remove_node(node)
        self.alias[node] = None
        return removed

    def _add_count(self, child: str, parent: str, count: int) -> None:
        if self.graph.has_edge(child, parent):
            self.graph[child][parent]["count"] += count
        else:
            self.graph.add_edge(child, parent, count=count)

    # ---------------------------------------------------------------------------------------- invariants
    def check(self, around: Iterable[str] | None = None) -> None:
        """Levels 1..l_max, edges only k -> k+1, a parent below l_max, images only on l1 nodes, acyclic.

        With `around`, only those nodes and their neighbours (after a merge or removal: the rest of the graph is
        unchanged, and a graph whose every edge climbs one level cannot have a cycle).
        """
        if around is None:
            problems = dag_problems(self.graph, self.l_max)
            with_images = list(self.images)
        else:
            near = {m for n in around if n in self.graph
                    for m in (n, *self.graph.succ[n], *self.graph.pred[n])}
            problems = dag_problems(self.graph, self.l_max, nodes=near, acyclic=False)
            with_images = [n for n in (*around, *near) if n in self.images]
        problems += [f"images attached to {n}, which is not an alive l1 node" for n in with_images
                     if n not in self.graph or self.level(n) != 1]
        if problems:
            raise DagError(f"concept DAG broken ({len(problems)} problems): " + "; ".join(problems[:5]))


def dag_problems(graph: nx.DiGraph, l_max: int, nodes: Iterable[str] | None = None, acyclic: bool = True
                 ) -> list[str]:
    """Structural problems of a concept graph: levels, level order of edges, parents below l_max, cycles."""
    problems: list[str] = []
    for n in graph.nodes if nodes is None else nodes:
        level = graph.nodes[n].get("level")
        if not isinstance(level, int) or not 1 <= level <= l_max:
            problems.append(f"node {n} has level {level!r}, outside 1..{l_max}")
            continue
        for parent in graph.succ[n]:
            if graph.nodes[parent].get("level") != level + 1:
                problems.append(f"edge {n} -> {parent} does not go from level {level} to {level + 1}")
        if level < l_max and not graph.succ[n]:
            problems.append(f"node {n} (level {level}) has no parent")
        if level == l_max and graph.succ[n]:
            problems.append(f"node {n} is at the top level {l_max} but has parents")
    if acyclic and not nx.is_directed_acyclic_graph(graph):
        cycle = nx.find_cycle(graph)
        problems.append(f"cycle {' -> '.join(u for u, _ in cycle)}")
    return problems
