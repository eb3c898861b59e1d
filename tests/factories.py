"""Small hand-built MAGIC datasets for unit tests of training, evaluation and visualization.

A 4-level binary-ish hierarchy whose l1 groups each have a characteristic colour, so a tiny model can learn
them; built directly as `MagicFile` + `CaptionDataset`, independent of the synthetic world and the DAG builder.
"""

from __future__ import annotations

import numpy as np

from cglib.data.dataset import CaptionDataset
from cglib.magic.schema import SCHEMA_VERSION, ImageRecord, MagicFile, Node, node_id

LEVEL_NAMES = {
    2: ["celebration", "sport", "meal"],
    3: ["social gathering", "leisure"],
    4: ["human activity"],
}
L1 = [("birthday party", "celebration"), ("wedding", "celebration"), ("tennis match", "sport"),
      ("ski trip", "sport"), ("breakfast", "meal"), ("picnic", "meal")]
PARENT = {"celebration": "social gathering", "meal": "social gathering", "sport": "leisure",
          "social gathering": "human activity", "leisure": "human activity"}


def tiny_magic(per_group: int = 8, image_size: int = 32, test_fraction: float = 0.25, seed: int = 0
               ) -> tuple[MagicFile, CaptionDataset]:
    """Six l1 groups under 3 l2, 2 l3, 1 l4; siblings are each other's hard negatives; deterministic."""
    rng = np.random.default_rng(seed)
    nodes: dict[str, Node] = {}
    for level, names in LEVEL_NAMES.items():
        for name in names:
            parent = PARENT.get(name)
            pid = node_id(level + 1, parent) if parent else None
            nodes[node_id(level, name)] = Node(id=node_id(level, name), level=level, name=name,
                                               parents={pid: 1} if pid else {}, primary_parent=pid)
    images: dict[str, ImageRecord] = {}
    pixels, ids, captions = [], [], {}
    palette = rng.integers(30, 225, size=(len(L1), 3))
    for g, (name, parent) in enumerate(L1):
        nid = node_id(1, name)
        siblings = [node_id(1, n) for n, p in L1 if p == parent and n != name]
        nodes[nid] = Node(id=nid, level=1, name=name, parents={node_id(2, parent): per_group},
                          primary_parent=node_id(2, parent), n_images=per_group,
                          generalized_captions=[f"a scene with {name.split()[0]} things", f"objects of kind {g}"],
                          hard_negatives=siblings, negative_similarity={s: 0.9 for s in siblings})
        n_test = max(1, round(per_group * test_fraction))
        for k in range(per_group):
            image_id = f"img-{g:02d}-{k:02d}"
            img = rng.integers(0, 40, size=(image_size, image_size, 3)) + palette[g]
            pixels.append(np.clip(img, 0, 255).astype(np.uint8))
            ids.append(image_id)
            captions[image_id] = [f"a picture of item {g} number {k}", f"colour pattern {g} variant {k % 3}"]
            images[image_id] = ImageRecord(id=image_id, node=nid, captions=captions[image_id],
                                           split="test" if k < n_test else "train")
    magic = MagicFile(schema_version=SCHEMA_VERSION, l_max=4, split_kind="image", nodes=nodes, images=images)
    for node in magic.nodes.values():
        if node.level > 1:
            node.n_images = sum(1 for i in images.values() if magic.ancestor(i.node, node.level) == node.id)
    dataset = CaptionDataset(source="synthetic", image_ids=ids, captions=captions, pixels=np.stack(pixels))
    return magic, dataset


def two_top_magic() -> MagicFile:
    """tiny_magic with a second l4 node `recreation` over `leisure`: the top tier of an RE item has a negative."""
    magic, _ = tiny_magic()
    magic = magic.model_copy(deep=True)
    top = node_id(4, "recreation")
    magic.nodes[top] = Node(id=top, level=4, name="recreation")
    leisure = magic.nodes[node_id(3, "leisure")]
    leisure.parents, leisure.primary_parent = {top: 1}, top
    for n in (top, node_id(4, "human activity")):
        magic.nodes[n].n_images = sum(1 for i in magic.images.values() if magic.ancestor(i.node, 4) == n)
    magic.nodes[node_id(4, "human activity")].parents = {}
    return magic
