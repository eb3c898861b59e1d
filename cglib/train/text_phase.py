"""What a text phase (textual pretraining, loss: re) trains: the whole text tower, or its projection alone.

`train.text_trains: tower` (the authors) trains every text weight, and each step runs the tower on the batch's
texts. `projection` (the demo: a frozen MiniLM with `model.text_projection: identity`) trains the linear
projection alone: the frozen tower's outputs do not change, so `ProjectedTexts` computes them once for every text
the phase can meet and a step only multiplies them by the projection (about 0.1 ms instead of seconds on a CPU).
The embeddings equal those of the full model at every step: normalize(W @ tower(text)).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from cglib.encoding import encode_texts, without_text_projection
from cglib.models import ClipModel
from cglib.train.step import set_trainable


class ProjectedTexts:
    """Text embeddings through the model's trainable projection, from tower outputs computed once: unit norm, or the
    projection's raw outputs when `normalize` is false (train.pretrain_features: raw)."""

    def __init__(self, bundle: ClipModel, texts: Sequence[str], normalize: bool = True) -> None:
        self.rows = {text: k for k, text in enumerate(dict.fromkeys(texts))}
        with without_text_projection(bundle):
            outputs = encode_texts(bundle, list(self.rows), normalize=False)
        self.outputs = torch.from_numpy(outputs).to(bundle.device)
        self.projection = bundle.text_projection()
        self.normalize = normalize

    def __len__(self) -> int:
        return len(self.rows)

    def __call__(self, texts: Sequence[str]) -> torch.Tensor:
        index = torch.tensor([self.rows[t] for t in texts], device=self.outputs.device)
        projected = self.projection(self.outputs[index])
        return F.normalize(projected, dim=-1) if self.normalize else projected


def text_phase_trainable(bundle: ClipModel, text_trains: str, texts: Sequence[str], world_size: int,
                         normalize: bool = True) -> ProjectedTexts | None:
    """Freeze the image tower and make the phase's text weights trainable; for `projection`, the texts' tower
    outputs (None for `tower`, whose steps run the tower), projected to unit norm unless `normalize` is false."""
    if text_trains == "tower":
        set_trainable(bundle, image=False, text=True)
        return None
    if world_size > 1:  # the steps bypass the DDP module, which would leave the projection's gradients unsynced
        raise ValueError("train.text_trains: projection trains on one process; run it without torchrun, or set "
                         "train.text_trains: tower")
    set_trainable(bundle, image=False, text=False)
    bundle.text_projection().weight.requires_grad_(True)
    return ProjectedTexts(bundle, texts, normalize)
