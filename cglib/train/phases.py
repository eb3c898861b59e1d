"""The phases of a run, as the one training loop sees them (`Trainer.run_phase`).

A phase supplies its batches, the module and objective that turn a micro-batch into loss parts, its optimizer
(`Stepper`) and its epochs; the loop does the rest (steps, counting, logging, checkpoints, callbacks) the same
way for all of them:

    textual_pretraining   caption -> target text pairs (pretrain.py), the text side alone (Sec. 3.2.4)
    re_alignment          HierarCaps' RE items (re_run.py), the text side alone (loss: re)
    image_text            MAGIC group batches (sampler.py, batches.py), the run's objective (objectives/)

Each builder also records what the run summary says about the phase in `trainer.described` (its sampler,
pretraining, re_training and precomputed texts), and prints the phase's steps per epoch before it starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from cglib.encoding import encode_texts, tokenize
from cglib.models import Towers
from cglib.train.batches import GroupBatchData, batch_loader
from cglib.train.inputs import text_source
from cglib.train.objectives import Objective, Setup, TextAlignment
from cglib.train.pretrain import PublishedTextPairSampler, TextPairSampler
from cglib.train.re_run import LOSS_PARTS, REBatchSampler, re_items
from cglib.train.sampler import GroupBatchSampler
from cglib.train.step import GroupTask, Stepper, set_trainable, wrap
from cglib.train.text_phase import text_phase_trainable

if TYPE_CHECKING:
    from cglib.train.trainer import Trainer


@dataclass
class Phase:
    """One phase: `batches(epoch, first)` yields the epoch's micro-batches from index `first`; `loss(item)` the
    loss parts of one; `micro_batches` of them make an optimizer step of `stepper`.

    name: Progress.phase (pretrain, re, train); losses: the Progress list of its epoch means; image_text: the
    phase counts images, data wait and compute time; keep_epoch_weights: train.keep_epoch_weights applies;
    log(items, result): extra log.csv columns of a step; empty(item): the micro-batch has nothing to train (the
    authors' empty loader item): the step leaves it out, and a step whose micro-batches are all empty changes no
    weight.
    """

    name: str
    title: str
    epochs: int
    batches_per_epoch: int
    batches: Callable[[int, int], Iterator[Any]]
    loss: Callable[[Any], dict[str, torch.Tensor]]
    objective: Objective
    stepper: Stepper
    micro_batches: int = 1
    losses: str = "epoch_losses"
    image_text: bool = False
    keep_epoch_weights: bool = True
    log: Callable[[list[Any], dict[str, float]], dict[str, Any]] = lambda items, result: {}
    empty: Callable[[Any], bool] = lambda item: False

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.batches_per_epoch / self.micro_batches)


def _sequential(batch: Callable[[int, int], Any], per_epoch: int) -> Callable[[int, int], Iterator[Any]]:
    """batches(epoch, first) of a sampler whose batch is a pure function of (epoch, index)."""
    return lambda epoch, first: (batch(epoch, index) for index in range(first, per_epoch))


def textual_pretraining(trainer: Trainer, ckpt: dict[str, Any] | None) -> Phase | None:
    """Caption -> target alignment of the text side (pretrain.py); None when the phase has no step."""
    t, info, bundle = trainer.t, trainer.info, trainer.bundle
    pairs = PublishedTextPairSampler if t.pretrain_pairs == "as_published" else TextPairSampler
    sampler = pairs(trainer.inputs.magic, trainer.entry.pretrain, t.pretrain_batch_size, trainer.run.train_seed)
    if sampler.batch_size % info.world_size:
        raise ValueError(f"train.pretrain_batch_size ({sampler.batch_size}) must be divisible by the number "
                         f"of processes ({info.world_size})")
    described = trainer.described["pretraining"] = sampler.describe()
    total = t.pretrain_epochs * len(sampler)
    if not total:
        return None
    projected = text_phase_trainable(bundle, t.text_trains, sampler.all_texts(), info.world_size)
    if projected is not None:
        described["tower_outputs_precomputed"] = len(projected)
    learned = t.pretrain_pairs == "as_published"  # the authors train the model's logit scale in this phase
    if learned:
        bundle.model.logit_scale.requires_grad_(True)
    bundle.model.train()
    module = wrap(Towers(bundle.model), info)
    stepper = trainer.make_stepper(module, t.pretrain_lr, total, "pretrain", ckpt)
    per = sampler.batch_size // info.world_size
    part = slice(info.rank * per, (info.rank + 1) * per)
    # the run's tau (the run's objective options are not its), or the model's learned scale
    align = TextAlignment({"tau": trainer.spec["run"]["tau"]},
                          logit_scale=(lambda: bundle.model.logit_scale) if learned else None)

    def loss(pair: tuple[list[str], list[str]]) -> dict[str, torch.Tensor]:
        captions, targets = pair
        if projected is not None:
            text = projected(captions[part] + targets[part])
        else:
            _, text = module(None, bundle.tokenizer(captions[part] + targets[part]).to(trainer.device))
        return align(text[:per], text[per:])

    trainer.announce(f"text pretraining (text {t.text_trains})", len(sampler), t.pretrain_epochs,
                     "distinct targets")
    return Phase("pretrain", "text pretraining", t.pretrain_epochs, len(sampler),
                 _sequential(sampler.batch, len(sampler)), loss, align, stepper, losses="pretrain_losses",
                 keep_epoch_weights=False)


def re_alignment(trainer: Trainer, ckpt: dict[str, Any] | None) -> Phase:
    """The HierarCaps RE alignment (re_run.py): the text side alone, on the items its options.data names."""
    t, bundle, objective = trainer.t, trainer.bundle, trainer.objective
    o = objective.options  # the run entry's options (REOptions)
    items, described = re_items(trainer.params, o.data, trainer.inputs.magic)
    sampler = REBatchSampler(items, o.batch_size, trainer.run.train_seed)
    per_epoch = len(sampler)
    re_info = {**described, **sampler.describe(), "epochs": o.epochs, "lr": o.lr,
               "weights": {"mean": o.w_mean, "minimax": o.w_minimax, "reg": o.w_reg},
               "regularizer": "embeddings of the starting text tower (eval mode), computed once"}
    trainer.described.update(re_training=re_info, sampler={**re_info, "optimizer_steps_per_epoch": per_epoch})
    # the frozen original tower: every text embedded once by the starting weights (a resumed run rebuilds them)
    texts = sampler.all_texts()
    original = bundle
    if ckpt is not None:
        original = trainer.files.fresh_model()
        original.model.to(trainer.device)
    frozen = torch.from_numpy(encode_texts(original, texts)).to(trainer.device)
    objective.reference(frozen, {text: k for k, text in enumerate(texts)})
    trainer.described["precomputed_texts"] = len(texts)
    projected = text_phase_trainable(bundle, t.text_trains, [*texts, ""], trainer.info.world_size)
    # eval mode: no dropout, as in HierarCaps' CLIP (whose towers have none); with a dropout tower (MiniLM:
    # 0.1) train mode would make the regularizer compare noisy embeddings with clean ones (reg > 0 at step 1)
    bundle.model.eval()
    module = wrap(Towers(bundle.model), trainer.info)
    stepper = trainer.make_stepper(module, o.lr, o.epochs * per_epoch, "re", ckpt)
    trainer.announce(f"RE alignment (text {t.text_trains})", per_epoch, o.epochs,
                     f"options.data: {o.data}, {len(items)} items, batch {sampler.batch_size}")

    def embed(texts: list[str]) -> torch.Tensor:
        if projected is not None:
            return projected(texts)
        return module(None, tokenize(bundle, texts).to(trainer.device))[1]

    return Phase("re", "RE", o.epochs, per_epoch, _sequential(sampler.batch, per_epoch),
                 lambda batch: objective(embed, batch), objective, stepper,
                 log=lambda items, result: {f"re_{k}": result[k] for k in LOSS_PARTS})


def image_text(trainer: Trainer, ckpt: dict[str, Any] | None) -> Phase:
    """The run's objective on MAGIC group batches (or n-gram groups); the objective is set up here."""
    t, info, bundle, objective, state = trainer.t, trainer.info, trainer.bundle, trainer.objective, trainer.state
    sampler = GroupBatchSampler(trainer.inputs.magic, t.groups_per_batch, t.pairs_per_group, trainer.run.train_seed,
                                text_source(trainer.params, trainer.entry), set(trainer.inputs.cache.image_ids),
                                epoch=t.epoch)
    if t.groups_per_batch % info.world_size:
        raise ValueError(f"train.groups_per_batch ({t.groups_per_batch}) must be divisible by the number of "
                         f"processes ({info.world_size}) so every rank holds whole groups")
    objective.check(trainer.params, trainer.entry)
    described = trainer.described["sampler"] = {
        **sampler.describe(), "optimizer_steps_per_epoch": math.ceil(len(sampler) / t.grad_accum),
        "group_source": trainer.entry.groups}
    if trainer.inputs.groups == "ngram":
        described["ngram"] = {k: v for k, v in trainer.inputs.magic.stats.get("ngram", {}).items()
                              if k not in ("too_frequent", "aliases", "removed_from_l1")}
    resumed = None if ckpt is None or ckpt["stepper"] is None else ckpt.get("objective")
    objective.setup(Setup(bundle, trainer.start_model, sampler, trainer.inputs, trainer.params, trainer.entry,
                          trainer.run.train_seed, t.epochs, trainer.device, resumed, state.step))
    set_trainable(bundle, image=True, text=not trainer.params.model.freeze_text)
    bundle.model.train()
    text_rows, table = None, None
    if trainer.params.model.freeze_text:  # a frozen text side: every text a batch can hold, embedded once
        extra = objective.replacement_texts()
        texts = sorted(set(sampler.all_texts()) | extra) if extra else sampler.all_texts()
        table = torch.from_numpy(encode_texts(bundle, texts, normalize=objective.unit_features)).to(trainer.device)
        text_rows = {text: k for k, text in enumerate(texts)}
    trainer.described["precomputed_texts"] = 0 if table is None else len(table)
    module = wrap(GroupTask(bundle, objective, table, t.mask_identical_texts), info)
    per_epoch = described["optimizer_steps_per_epoch"]
    stepper = trainer.make_stepper(module, t.lr, t.epochs * per_epoch, "train", ckpt, objective)
    empty = described.get("dropped_as_published", {}).get("expected_empty_steps_per_epoch")
    trainer.announce("image-text", per_epoch, t.epochs, f"train.epoch: {t.epoch}, {described['training_pairs']} "
                     f"training pairs{objective.announce()}"
                     + (f", about {empty} empty steps an epoch, skipped as the authors' loop does" if empty else ""))

    def batches(epoch: int, first: int) -> Iterator[dict[str, Any]]:
        data = GroupBatchData(sampler, trainer.inputs.cache, epoch, first, info, text_rows, bundle.tokenizer,
                              objective.pair_replacements())
        return batch_loader(data, t.num_workers, trainer.device)

    return Phase("train", "image-text", t.epochs, len(sampler), batches, module, objective, stepper,
                 micro_batches=t.grad_accum, image_text=True,
                 log=lambda items, result: {"fallback_groups": sum(item["fallback_groups"] for item in items),
                                            "repeated_images": sum(item["repeated_images"] for item in items)},
                 empty=lambda item: item.get("empty", False))
