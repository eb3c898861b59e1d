"""A momentum memory of concept centroids (Pu et al., "Dynamic Conceptional Contrastive Learning for Generalized
Category Discovery", DCCL, CVPR 2023): conception-level contrast against every concept, not only the batch's.

`ConceptMemory` holds one unit image centroid and one unit text centroid per MAGIC training group (G x L each,
row k = the sampler's k-th group, `GroupBatchSampler.groups` order). `cglib.losses.memory_centroid_loss`
contrasts the batch against all G rows (the batch's groups live, the rest constant); after each optimizer step
the batch's detached centroids move their rows:

    mem[g] <- normalize(m * mem[g] + (1 - m) * batch_centroid[g])          (m = train.runs[i].options.memory_momentum)

Initialization (`initial_memory`): before the image-text phase the model (eval mode, no gradient, no RNG drawn)
encodes each training group's images and the texts of its training pairs once; a row is the normalized mean of
its unit embeddings. The memory is saved in the training checkpoint (`state_dict`), so a resumed run continues
from the same rows. Distributed (torchrun): the loss gathers every rank's groups (and their rows), so every rank
stages the same centroids and applies the same update; `broadcast` copies rank 0's rows to every rank once at
the start, so the ranks' memories start, and stay, identical (tests/test_related_memory_distributed.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from cglib.encoding import encode_images, encode_texts

_EPS = 1e-12


class ConceptMemory:
    """Unit image and text centroids of G concepts with the momentum update; updates are staged, then committed."""

    def __init__(self, image: Tensor, text: Tensor, momentum: float) -> None:
        if image.ndim != 2 or image.shape != text.shape:
            raise ValueError(f"memory image {tuple(image.shape)} and text {tuple(text.shape)} rows must both be "
                             "(G concepts, L dims)")
        if not 0.0 < momentum < 1.0:
            raise ValueError(f"memory momentum must lie strictly between 0 and 1, got {momentum}")
        self.image = F.normalize(image.detach().float(), dim=-1, eps=_EPS)
        self.text = F.normalize(text.detach().float(), dim=-1, eps=_EPS)
        self.momentum = float(momentum)
        self._staged: list[tuple[Tensor, Tensor]] = []

    def __len__(self) -> int:
        return self.image.shape[0]

    def to(self, device: torch.device) -> ConceptMemory:
        """Move the rows to `device` (in place; returns self)."""
        self.image, self.text = self.image.to(device), self.text.to(device)
        return self

    def broadcast(self, src: int = 0) -> ConceptMemory:
        """Copy rank `src`'s rows to every rank (no-op without an initialized process group); returns self."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast(self.image, src)
            dist.broadcast(self.text, src)
        return self

    def update(self, index: Tensor, centroids: Tensor) -> None:
        """mem[index[k]] <- normalize(m * mem[index[k]] + (1 - m) * centroids[:, k]); centroids (2, K, L): image, text."""
        index = index.to(self.image.device, torch.long)
        if len(torch.unique(index)) != len(index):
            raise ValueError(f"memory update got a row twice in one batch ({index.tolist()}); stage each batch "
                             "separately")
        new = centroids.detach().to(self.image.device, torch.float32)
        m = self.momentum
        for rows, fresh in ((self.image, new[0]), (self.text, new[1])):
            rows[index] = F.normalize(m * rows[index] + (1 - m) * F.normalize(fresh, dim=-1, eps=_EPS), dim=-1,
                                      eps=_EPS)

    def stage(self, index: Tensor, centroids: Tensor) -> None:
        """Remember one micro-batch's centroids; `commit` applies them after the optimizer step, in order."""
        self._staged.append((index.detach(), centroids.detach()))

    def commit(self) -> None:
        """Apply the staged updates in order (after a completed optimizer step)."""
        for index, centroids in self._staged:
            self.update(index, centroids)
        self._staged.clear()

    def discard(self) -> None:
        """Drop the staged updates (a skipped step changes neither weights nor memory)."""
        self._staged.clear()

    def state_dict(self) -> dict[str, Any]:
        """Rows and momentum as CPU tensors and a float (loads with torch.load(weights_only=True))."""
        return {"image": self.image.cpu().clone(), "text": self.text.cpu().clone(), "momentum": self.momentum}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> ConceptMemory:
        """A memory holding exactly the saved rows (bit for bit: the constructor's normalization is undone)."""
        memory = cls(state["image"], state["text"], state["momentum"])
        memory.load_state_dict(state)
        return memory

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved (same G, L and momentum)."""
        if tuple(state["image"].shape) != tuple(self.image.shape) or state["momentum"] != self.momentum:
            raise ValueError(f"the checkpoint's memory ({tuple(state['image'].shape)}, momentum "
                             f"{state['momentum']}) does not fit this run's ({tuple(self.image.shape)}, "
                             f"{self.momentum}); delete the checkpoint (or set train.resume: false)")
        device = self.image.device
        self.image, self.text = state["image"].to(device).float(), state["text"].to(device).float()
        self._staged.clear()


def group_centroids(vectors: np.ndarray, members: list[list[int]]) -> np.ndarray:
    """(G, L) float32: row g = the normalized mean of the unit rows `vectors[members[g]]`."""
    out = np.stack([vectors[rows].mean(axis=0) for rows in members]).astype(np.float32)
    norms = np.maximum(np.linalg.norm(out, axis=1, keepdims=True), _EPS)
    return out / norms


def initial_memory(bundle: Any, sampler: Any, cache: Any, momentum: float, chunk: int = 1024) -> ConceptMemory:
    """The memory at the model's current weights: each training group's images and pair texts encoded once."""
    images = sorted({i for g in sampler.groups for i in sampler.images[g]})
    texts = sorted({t for g in sampler.groups for _, t in sampler.pairs[g]})
    image_row = {i: k for k, i in enumerate(images)}
    text_row = {t: k for k, t in enumerate(texts)}
    image_vectors = np.concatenate([encode_images(bundle, cache.get(images[s:s + chunk]))
                                    for s in range(0, len(images), chunk)])
    text_vectors = encode_texts(bundle, texts)
    image_centroids = group_centroids(image_vectors, [[image_row[i] for i in sampler.images[g]]
                                                      for g in sampler.groups])
    # a text counts once per training pair that carries it, as the batches draw pairs
    text_centroids = group_centroids(text_vectors, [[text_row[t] for _, t in sampler.pairs[g]]
                                                    for g in sampler.groups])
    return ConceptMemory(torch.from_numpy(image_centroids), torch.from_numpy(text_centroids), momentum)
