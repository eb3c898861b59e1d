"""The RE items a `loss: re` run aligns its text tower on: from this run's MAGIC train split or the authors'
HierarCaps train hierarchies (`options.data`)."""

from __future__ import annotations

from collections import Counter
from typing import Any, NamedTuple

from cglib.config import Params
from cglib.data.hierarcaps_train import REItem, load_hierarcaps_train
from cglib.magic.re_items import re_items_from_magic
from cglib.magic.schema import MagicFile


class REItems(NamedTuple):
    """A run's RE items and the record of where they come from (the run summary's `re_training`); unpacks as
    (items, record)."""

    items: list[REItem]
    record: dict[str, Any]


def re_items(params: Params, data: str, magic: MagicFile) -> REItems:
    """The RE items of options.data `data` ("magic": built from `magic`'s train split; "hierarcaps_train": read
    from data.hierarcaps_train_csv) and a record of where they come from, for the summary."""
    if data == "magic":
        items, counts = re_items_from_magic(magic, "train", params.run.seed, single_top="drop")
        what = ("MAGIC train split: per image its concept chain names l_max..l1 (the l1-l4 evaluation queries) "
                "then one of its original captions; negatives same-level names off the chain and another image's "
                "caption" + ("; the top tier is left out (a single top-level node has no negative)"
                             if counts.get("dropped top tier: a single top-level node") else ""))
    else:
        path = params.data.hierarcaps_train_csv
        if path is None:
            raise ValueError("options.data: hierarcaps_train needs data.hierarcaps_train_csv (`cglib download "
                             "hierarcaps-train --dest DIR` fetches it)")
        items, counts = load_hierarcaps_train(path)
        what = f"HierarCaps train hierarchies ({path.name}): four tiers, the last a caption"
    if not items:
        raise ValueError(f"options.data: {data} gave no RE item ({dict(counts)}); check the MAGIC train split "
                         "(images with captions and concept chains) or the HierarCaps train file")
    return REItems(items, {"re_data": data, "data": what, "items": len(items), "tiers": len(items[0].positives),
                           "counts": dict(sorted(Counter(counts).items()))})
