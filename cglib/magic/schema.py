"""`magic.json`: the grouped dataset that training and evaluation read: its schema and queries.

Nodes are keyed `l{level}:{canonical name}`, so the same string at two levels is two nodes and edges only go
from level k to k+1. Images attach to exactly one l1 node. A node may have several parents (images disagreed);
each edge keeps its image count and the most frequent parent is `primary_parent`, which defines an image's
chain. Building the file is `cglib.magic.build`'s job, reading and writing it `cglib.magic.files`'s.
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 2


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def node_id(level: int, name: str) -> str:
    """The key of the concept `name` at `level`."""
    return f"l{level}:{name}"


class Node(_Strict):
    id: str
    level: int = Field(ge=1)
    name: str
    parents: dict[str, int] = Field(default_factory=dict, description="parent id -> images supporting the edge")
    primary_parent: str | None = None
    n_images: int = Field(0, ge=0, description="images under the node (l1: attached; higher: via primary chains)")
    generalized_captions: list[str] = Field(default_factory=list, description="l1 nodes: LLM_gen captions "
                                            "(magic.generalize: group; empty in image mode)")
    hard_negatives: list[str] = Field(default_factory=list, description="same-level nodes above the threshold")
    fallback_negatives: list[str] = Field(
        default_factory=list, description="most similar same-level nodes below the threshold, added to reach k")
    negative_similarity: dict[str, float] = Field(default_factory=dict, description="node id -> concept cosine")
    merged_from: list[str] = Field(default_factory=list, description="node ids merged into this one (any round)")
    generalized_fallback: bool = Field(
        False, description="LLM_gen failed for this node: generalized_captions hold original captions instead")


class ImageRecord(_Strict):
    id: str
    node: str = Field(description="the l1 node id")
    captions: list[str]
    split: Literal["train", "test"]
    raw_chain: list[str] = Field(default_factory=list, description="the abstraction's own names l1..l_max")
    generalized_captions: list[str] = Field(
        default_factory=list, description="LLM_gen captions written for this image (magic.generalize: image)")
    generalized_fallback: bool = Field(
        False, description="LLM_gen failed for this image: generalized_captions hold its original captions")


class MergeRecord(_Strict):
    level: int
    source: str
    target: str
    similarity: float
    n_images: int
    round: int


class RemovalRecord(_Strict):
    level: int
    node: str
    n_images: int
    best_match: str | None
    similarity: float | None
    image_ids: list[str]


class MagicFile(_Strict):
    schema_version: int
    l_max: int = Field(ge=1)
    split_kind: Literal["image", "concept"]
    generalize: Literal["image", "level", "group"] = Field(
        "group", description="where generalized captions live and how they were asked for: per image (image: "
        "one request per image, paper Sec. 3.1 step 5; level: one per image and level, the authors' "
        "generate_new_caption.py) or per l1 node (group: Algorithm 1 as printed)")
    nodes: dict[str, Node]
    images: dict[str, ImageRecord]
    merges: list[MergeRecord] = Field(default_factory=list)
    removals: list[RemovalRecord] = Field(default_factory=list)
    skipped: dict[str, int] = Field(default_factory=dict, description="reason -> images dropped before the DAG")
    stats: dict = Field(default_factory=dict)
    provenance: dict = Field(default_factory=dict)

    # ---------------------------------------------------------------------------------------- queries
    def nodes_at(self, level: int) -> list[Node]:
        """Nodes of one level, sorted by id (deterministic)."""
        return [self.nodes[k] for k in sorted(self.nodes) if self.nodes[k].level == level]

    def ancestor(self, node: str, level: int) -> str:
        """The node's ancestor at `level` along primary parents (the node itself at its own level)."""
        current = self.nodes[node]
        while current.level < level:
            if current.primary_parent is None:
                raise ValueError(f"node {current.id} has no parent; its chain stops below level {level}")
            current = self.nodes[current.primary_parent]
        return current.id

    def chain(self, image_id: str) -> list[str]:
        """Node ids l1..l_max of an image along primary parents."""
        l1 = self.images[image_id].node
        return [self.ancestor(l1, level) for level in range(1, self.l_max + 1)]

    def chain_names(self, image_id: str) -> list[str]:
        """Concept names l1..l_max of an image."""
        return [self.nodes[n].name for n in self.chain(image_id)]

    @cached_property
    def _images_by_l1(self) -> dict[str, list[str]]:
        by: dict[str, list[str]] = {}
        for image_id in sorted(self.images):
            by.setdefault(self.images[image_id].node, []).append(image_id)
        return by

    @cached_property
    def _l1_under(self) -> dict[str, list[str]]:
        """Node id -> the l1 nodes with images whose primary chain passes through it."""
        under: dict[str, list[str]] = {n: [] for n in self.nodes}
        for l1 in self._images_by_l1:
            for level in range(1, self.l_max + 1):
                under[self.ancestor(l1, level)].append(l1)
        return under

    def images_of(self, node: str, split: str | None = None) -> list[str]:
        """Sorted image ids under a node of any level (via primary chains), optionally of one split."""
        self.nodes[node]  # KeyError for an unknown node
        ids = [i for l1 in self._l1_under[node] for i in self._images_by_l1[l1]]
        return sorted(i for i in ids if split is None or self.images[i].split == split)

    def children(self, node: str, primary_only: bool = True) -> list[str]:
        """Sorted ids of the nodes one level down whose primary parent (or any parent) is `node`."""
        return sorted(n.id for n in self.nodes.values()
                      if (n.primary_parent == node if primary_only else node in n.parents))

    def groups(self, split: str | None = None) -> list[str]:
        """l1 node ids that have at least one image (of `split`, when given)."""
        return [n.id for n in self.nodes_at(1) if self.images_of(n.id, split)]

    def negatives(self, node: str, include_fallback: bool = True, split: str | None = None) -> list[str]:
        """Hard negatives of a node (threshold ones first, then flagged fallbacks), most similar first.

        With `split`, only negatives that have images of that split (with a concept split, a training batch
        must not draw a held-out concept as a negative).
        """
        n = self.nodes[node]
        found = n.hard_negatives + (n.fallback_negatives if include_fallback else [])
        return found if split is None else [m for m in found if self.images_of(m, split)]

    @property
    def per_image(self) -> bool:
        """Whether generalized captions live on images (generalize: image or level) rather than on l1 nodes."""
        return self.generalize != "group"

    def generalized_texts(self, image_id: str) -> list[str]:
        """The generalized captions that pair with an image: its own (generalize: image, level; with level, its
        l1 caption first) or its l1 node's (group)."""
        record = self.images[image_id]
        if self.per_image:
            return list(record.generalized_captions)
        return list(self.nodes[record.node].generalized_captions)

    def split_ids(self, split: str) -> list[str]:
        """Sorted image ids of one split."""
        return sorted(i for i, rec in self.images.items() if rec.split == split)
