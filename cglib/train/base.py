"""The pretrained base of the offline profiles: a model that already aligns images with captions.

In the paper every Table 3 row starts from OpenAI's CLIP, which scores 69.7% on MAGIC captions before any
fine-tuning; fine-tuning then adds a few points. Offline there are no CLIP weights, so `train.base.corpus` trains
such a base the way CLIP was trained - the standard symmetric InfoNCE on (image, original caption) pairs - on a
corpus disjoint from what MAGIC tests:

    synthetic     scenes rendered from another seed of the synthetic world (run.seed + train.base.seed_offset):
                  the same taxonomy and templates, none of MAGIC's images
    magic_train   the MAGIC-train images with their original captions (as CLIP's web data held captions):
                  never a test image, never a concept name, never a generalized caption

The base becomes `training/initial.safetensors`: the zero-shot row of Table 3 and the starting point of every
`train.runs` entry. Its record (`initial.json` -> "base") says what it saw, how long it trained and its loss per
epoch. Each epoch pairs every image with one of its captions (seeded), shuffles, and cuts batches of
`train.base.batch_size`; identical captions in a batch are never each other's negatives (`text_ids`). A frozen
text tower (the demo's MiniLM) is encoded once, so only the image tower trains. Base training is short and is not
checkpointed: an interrupted base is trained again from the start. The corpus and its image cache are prepared
before training (cglib.prepare.base, with the rest of the run's inputs).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from cglib import losses
from cglib.config import Params
from cglib.data.dataset import CaptionDataset
from cglib.encoding import encode_texts, pixels_to_tensor, tokenize
from cglib.frontend import tqdm
from cglib.models import ClipModel, Towers
from cglib.prepare.base import BaseCorpus
from cglib.train.optim import amp_dtype
from cglib.train.step import Stepper, set_trainable


def _pairs(dataset: CaptionDataset, image_ids: list[str], rng: np.random.Generator) -> list[tuple[int, str]]:
    """One (cache row, caption) pair per image, each caption drawn with `rng`, in shuffled order."""
    pairs = [(row, dataset.captions[i][int(rng.integers(len(dataset.captions[i])))])
             for row, i in enumerate(image_ids)]
    return [pairs[k] for k in rng.permutation(len(pairs))]


def train_base(params: Params, bundle: ClipModel, corpus: BaseCorpus, device: torch.device | str = "cpu",
               progress: bool = True, seed: int | None = None) -> dict[str, Any]:
    """Train `bundle` in place with the CLIP loss on the prepared base corpus's (image, caption) pairs
    (cglib.prepare.base: its dataset and image cache); return the training record.

    `seed` (the training seed's, `RunContext.train_seed`; default run.seed) orders the pairs and picks their captions.
    """
    base, t = params.train.base, params.train
    device = torch.device(device)
    dataset, cache = corpus.dataset, corpus.cache
    if cache.size != bundle.image_size:
        raise ValueError(f"the base corpus was cached at {cache.size}px but the model reads {bundle.image_size}px "
                         "images; prepare the inputs again for these params (cglib.prepare.prepare_inputs)")
    image_ids = list(cache.image_ids)
    if len(image_ids) < 2:
        raise ValueError(f"the base corpus has {len(image_ids)} readable images; base training needs at least 2")
    batch_size = min(base.batch_size, len(image_ids))
    per_epoch = len(image_ids) // batch_size  # the last partial batch is dropped (a batch of one has no negative)
    total = base.epochs * per_epoch
    frozen_text = params.model.freeze_text
    bundle.model.to(device)
    set_trainable(bundle, image=True, text=not frozen_text)
    table, rows = None, None
    if frozen_text:  # the text side is a fixed function: encode every caption once
        texts = sorted({c for i in image_ids for c in dataset.captions[i]})
        rows = {text: k for k, text in enumerate(texts)}
        table = torch.from_numpy(encode_texts(bundle, texts)).to(device)
    bundle.model.train()
    module = Towers(bundle.model)
    warmup = base.warmup_steps if base.warmup_steps < total else total // 10  # as Trainer does for short runs
    stepper = Stepper(bundle.model, module, lr=base.lr, weight_decay=t.weight_decay, warmup_steps=warmup,
                      total_steps=total, amp=amp_dtype(t.amp, device), grad_clip=t.grad_clip, device=device)

    def loss_fn(batch: list[tuple[int, str]]) -> dict[str, torch.Tensor]:
        pixels = torch.from_numpy(cache.pixels[[row for row, _ in batch]]).to(device)
        captions = [c for _, c in batch]
        distinct = {c: k for k, c in enumerate(dict.fromkeys(captions))}
        ids = torch.tensor([distinct[c] for c in captions], device=device)
        if table is not None:
            image, _ = module(pixels_to_tensor(pixels, bundle), None)
            text = table[torch.tensor([rows[c] for c in captions], device=device)]
        else:
            image, text = module(pixels_to_tensor(pixels, bundle), tokenize(bundle, captions).to(device))
        return {"loss": losses.clip_loss(image, text, tau=t.tau, text_ids=ids)}

    epoch_losses: list[float] = []
    started = time.perf_counter()
    bar = tqdm(total=total, desc="base (CLIP loss)", disable=not progress, leave=True)
    for epoch in range(base.epochs):
        rng = np.random.default_rng([params.run.seed if seed is None else seed, base.seed_offset, epoch])
        pairs = _pairs(dataset, image_ids, rng)
        running = 0.0
        for b in range(per_epoch):
            result = stepper.step([pairs[b * batch_size:(b + 1) * batch_size]], loss_fn)
            running += result["loss"]
            bar.update(1)
        epoch_losses.append(running / per_epoch)
        bar.set_postfix(loss=f"{epoch_losses[-1]:.3f}")
    bar.close()
    bundle.model.eval()
    return {"images": len(image_ids), "skipped_images": dict(cache.skipped),
            "captions": sum(len(dataset.captions[i]) for i in image_ids), "epochs": base.epochs,
            "batch_size": batch_size, "steps": total, "lr": base.lr, "loss": "clip", "tau": t.tau,
            "text_tower_trained": not frozen_text, "epoch_losses": [round(x, 5) for x in epoch_losses],
            "chance_loss": round(math.log(batch_size), 5), "wall_s": round(time.perf_counter() - started, 2)}
