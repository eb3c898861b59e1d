"""GraphML export of the concept hierarchy (for Gephi, Cytoscape, yEd or `networkx.read_graphml`).

GraphML attributes must be scalars: lists (generalized captions, negatives, merged nodes) are stored as JSON
strings, a missing primary parent as "". Edges go child -> parent with `count` and `primary`; hard negatives are
node attributes, not edges, so the exported graph stays a DAG.
"""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx

from cglib.magic.schema import MagicFile


def to_networkx(magic: MagicFile) -> nx.DiGraph:
    """The hierarchy as a DiGraph with GraphML-safe attributes (str, int, float, bool only)."""
    graph = nx.DiGraph(l_max=magic.l_max, split_kind=magic.split_kind, schema_version=magic.schema_version,
                       generalize=magic.generalize)  # image mode: the captions live on images, not on nodes
    for n in magic.nodes.values():
        train = len(magic.images_of(n.id, "train"))
        graph.add_node(
            n.id, level=n.level, name=n.name, n_images=n.n_images, n_train=train, n_test=n.n_images - train,
            primary_parent=n.primary_parent or "", generalized_fallback=n.generalized_fallback,
            generalized_captions=json.dumps(n.generalized_captions, ensure_ascii=False),
            hard_negatives=json.dumps(n.hard_negatives, ensure_ascii=False),
            fallback_negatives=json.dumps(n.fallback_negatives, ensure_ascii=False),
            negative_similarity=json.dumps(n.negative_similarity, ensure_ascii=False),
            merged_from=json.dumps(n.merged_from, ensure_ascii=False))
    for n in magic.nodes.values():
        for parent, count in n.parents.items():
            graph.add_edge(n.id, parent, count=int(count), primary=parent == n.primary_parent)
    return graph


def write_graphml(magic: MagicFile, path: str | Path) -> Path:
    """Write magic.graphml (atomic rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".graphml.tmp")
    nx.write_graphml(to_networkx(magic), tmp)
    tmp.replace(path)
    return path
