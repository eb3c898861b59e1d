"""Batch data of the image-text phase: the sampler's group batches as tensors, for a DataLoader."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from cglib.data.crop_cache import CropCache
from cglib.data.image_cache import ImageCache
from cglib.distributed import DistInfo
from cglib.train.sampler import GroupBatchSampler


class GroupBatchData(torch.utils.data.Dataset):
    """Batches of one epoch from position `start`, as tensors: uint8 pixels plus text rows or tokens.

    Every item carries `text_ids`, this rank's (m*n,) slice of ids over the WHOLE batch's distinct texts (equal id
    = identical string, the same on every rank), which the losses use to keep identical texts from being each
    other's negatives, and `group_index`, each of this rank's groups' position in `sampler.groups` (its row of a
    concept memory, cglib/train/objectives/concept_memory.py). Each rank keeps its own groups; a DataLoader may run this in worker
    processes (the cache is a memmap). An empty batch (the authors' epoch, `GroupBatch.empty`) is an item with
    `empty: True`, its index and zero counts, no tensors: the same on every rank.

    With `hard_negatives` (loss: clip_hn; a function of the whole batch, cglib.train.objectives.keyword_negatives) an item also
    carries `hard_columns` (this rank's pairs' replaced global columns, -1: none) and the permuted texts as
    `hard_rows` (text table rows) or `hard_inverse` (into the tokenized texts); a pair without one points at its
    own text, which the loss ignores.
    """

    def __init__(self, sampler: GroupBatchSampler, cache: ImageCache, epoch: int, start: int, info: DistInfo,
                 text_rows: dict[str, int] | None, tokenizer: Callable | None,
                 hard_negatives: Callable[[Any], list[Any]] | None = None, crops: CropCache | None = None,
                 crop_seed: int = 0) -> None:
        self.sampler, self.cache, self.epoch, self.start, self.info = sampler, cache, epoch, start, info
        self.text_rows, self.tokenizer = text_rows, tokenizer
        self.group_rows = {g: k for k, g in enumerate(sampler.groups)}  # memory row of each group (memory.py)
        self.hard_negatives = hard_negatives
        self.crops, self.crop_seed = crops, crop_seed

    def __len__(self) -> int:
        return len(self.sampler) - self.start

    def __getitem__(self, i: int) -> dict[str, Any]:
        full = self.sampler.batch(self.epoch, self.start + i)
        if full.empty:  # the authors' empty loader item: the loop skips its step (Phase.empty)
            return {"empty": True, "index": self.start + i, "fallback_groups": 0, "repeated_images": 0,
                    "global_images": 0, "groups": list(full.groups)}
        batch = full.shard(self.info.rank, self.info.world_size)
        m, n = batch.shape
        ids = [image_id for row in batch.image_ids for image_id in row]
        texts = [t for row in batch.texts for t in row]
        identity = {t: k for k, t in enumerate(sorted({t for row in full.texts for t in row}))}
        item: dict[str, Any] = {"pixels": torch.from_numpy(self.pixels(full, ids, self.start + i)), "m": m, "n": n,
                                "index": self.start + i, "fallback_groups": full.n_fallback,
                                "repeated_images": full.repeated_images, "global_images": len(full.groups) * n,
                                "text_ids": torch.tensor([identity[t] for t in texts], dtype=torch.long),
                                "group_index": torch.tensor([self.group_rows[g] for g in batch.groups],
                                                            dtype=torch.long),
                                "groups": list(batch.groups)}  # this rank's node ids (loss: mcc reads concepts)
        hard: list[str] = []
        if self.hard_negatives is not None:  # chosen on the whole batch: this rank's pairs are a contiguous slice
            offset = self.info.rank * m * n
            chosen = self.hard_negatives(full)[offset:offset + m * n]
            hard = [h.text if h.text is not None else t for h, t in zip(chosen, texts, strict=True)]
            item["hard_columns"] = torch.tensor([h.column for h in chosen], dtype=torch.long)
        if self.text_rows is not None:
            item["text_rows"] = torch.tensor([self.text_rows[t] for t in texts], dtype=torch.long)
            if hard:
                item["hard_rows"] = torch.tensor([self.text_rows[t] for t in hard], dtype=torch.long)
        else:  # trainable text tower: tokenize each distinct text once
            unique = sorted(set(texts) | set(hard))
            where = {t: k for k, t in enumerate(unique)}
            item["tokens"] = self.tokenizer(unique)
            item["text_inverse"] = torch.tensor([where[t] for t in texts], dtype=torch.long)
            if hard:
                item["hard_inverse"] = torch.tensor([where[t] for t in hard], dtype=torch.long)
        return item

    def pixels(self, full: Any, ids: list[str], index: int) -> np.ndarray:
        """uint8 images of this rank's pairs: the eval crops of the image cache, or (train.augment) random resized
        crops whose boxes are drawn for the whole batch, in its order, from a generator seeded by (crop_seed,
        epoch, index): every rank keeps its slice of one draw, and a resumed run draws the same crops."""
        if self.crops is None:
            return self.cache.get(ids)
        everyone = [image_id for row in full.image_ids for image_id in row]
        offset = self.info.rank * len(ids)
        seed = int(np.random.SeedSequence([self.crop_seed, self.epoch, index, 7]).generate_state(1)[0])
        return self.crops.crops(everyone, torch.Generator().manual_seed(seed), slice(offset, offset + len(ids)))


def batch_loader(dataset: torch.utils.data.Dataset, num_workers: int, device: torch.device
                 ) -> Iterator[dict[str, Any]]:
    """Iterate a batch dataset; a private generator keeps the global RNG untouched (exact resume)."""
    return iter(torch.utils.data.DataLoader(dataset, batch_size=None, shuffle=False, num_workers=num_workers,
                                            pin_memory=device.type == "cuda", generator=torch.Generator()))

