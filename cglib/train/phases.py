"""The phases of a run, as the one training loop sees them (`Trainer.run_phase`).

A phase supplies its batches, the module and objective that turn a micro-batch into loss parts, its optimizer
(`Stepper`) and its epochs; the loop does the rest (steps, counting, logging, checkpoints, callbacks) the same
way for all of them:

    textual_pretraining   caption -> target text pairs (pretrain.py), the text side alone (Sec. 3.2.4)
    re_alignment          HierarCaps' RE items (re_run.py), the text side alone (loss: re)
    image_text            MAGIC group batches (sampler.py, batches.py), the run's objective (objectives/)

A builder reads the run's fixed setup (setup.py), its state (state.py) and its model; it records what the run
summary says about the phase in `state.described` (its sampler, pretraining, re_training and precomputed texts) and
the warmup it used in `state.warmup_used`, and prints the phase's steps per epoch before it starts.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from cglib.encoding import encode_texts, tokenize
from cglib.models import ClipModel, Towers
from cglib.train.batches import GroupBatchData, batch_loader
from cglib.train.inputs import text_source
from cglib.train.objectives import Objective, Setup, TextAlignment
from cglib.train.pretrain import PublishedTextPairSampler, TextPairSampler
from cglib.train.re_run import LOSS_PARTS, REBatchSampler
from cglib.train.sampler import GroupBatchSampler
from cglib.train.setup import RunSetup
from cglib.train.state import TrainState
from cglib.train.step import GroupTask, Stepper, set_trainable, wrap
from cglib.train.text_phase import text_phase_trainable


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


def _warmup(setup: RunSetup, state: TrainState, total: int, phase: str) -> int:
    """train.warmup_steps, or a tenth of a phase too short for it (warned and recorded in the summary)."""
    t = setup.t
    warmup = t.warmup_steps
    if phase in ("pretrain", "re"):  # the text phases are short: their warmup is at most a tenth of them
        warmup = min(warmup, total // 10)
    elif warmup >= total:
        warmup = total // 10
        warnings.warn(f"train.warmup_steps ({t.warmup_steps}) >= the run's {total} optimizer steps; "
                      f"warming up over {warmup} steps instead", stacklevel=2)
    state.warmup_used[phase] = warmup
    return warmup


def make_stepper(setup: RunSetup, state: TrainState, bundle: ClipModel, module: torch.nn.Module, lr: float,
                 total: int, phase: str, ckpt: dict[str, Any] | None,
                 head: torch.nn.Module | None = None) -> Stepper:
    """The phase's optimizer over the model (and `head`, an objective with trainable weights), restored from
    the checkpoint when it was saved inside this phase."""
    t = setup.t
    stepper = Stepper(bundle.model, module, lr=lr, weight_decay=t.weight_decay,
                      warmup_steps=_warmup(setup, state, total, phase), total_steps=total, amp=setup.amp,
                      grad_clip=t.grad_clip, device=setup.device, head=head, betas=t.adam_betas, eps=t.adam_eps)
    if ckpt is not None:
        if ckpt["stepper"] is not None:  # None: saved between phases, the new phase starts a fresh optimizer
            stepper.load_state_dict(ckpt["stepper"])
        setup.files.set_rng(ckpt["rng"])
    return stepper


def announce(setup: RunSetup, state: TrainState, phase: str, per_epoch: int, epochs: int, how: str) -> None:
    """Print steps per epoch before a phase starts (also stored in the summary)."""
    if setup.info.is_main and state.progress.step == 0:
        print(f"{setup.entry.name}: {phase}, {per_epoch} optimizer steps per epoch x {epochs} epochs ({how})")


def start_model(setup: RunSetup, state: TrainState, bundle: ClipModel) -> ClipModel:
    """The run's STARTING model: the current one before any step, else rebuilt without touching the RNG."""
    if state.progress.global_step == 0:
        return bundle
    with torch.random.fork_rng(devices=[]):  # building a model draws init weights: keep the run's RNG stream
        return setup.files.fresh_model()


def _sequential(batch: Callable[[int, int], Any], per_epoch: int) -> Callable[[int, int], Iterator[Any]]:
    """batches(epoch, first) of a sampler whose batch is a pure function of (epoch, index)."""
    return lambda epoch, first: (batch(epoch, index) for index in range(first, per_epoch))


def textual_pretraining(setup: RunSetup, state: TrainState, bundle: ClipModel,
                        ckpt: dict[str, Any] | None) -> Phase | None:
    """Caption -> target alignment of the text side (pretrain.py); None when the phase has no step."""
    t, info = setup.t, setup.info
    pairs = PublishedTextPairSampler if t.pretrain_pairs == "as_published" else TextPairSampler
    sampler = pairs(setup.inputs.magic, setup.entry.pretrain, t.pretrain_batch_size, setup.run.train_seed)
    if sampler.batch_size % info.world_size:
        raise ValueError(f"train.pretrain_batch_size ({sampler.batch_size}) must be divisible by the number "
                         f"of processes ({info.world_size})")
    described = state.described["pretraining"] = sampler.describe()
    total = t.pretrain_epochs * len(sampler)
    if not total:
        return None
    unit = t.pretrain_features == "normalized"  # raw: the tower's outputs as the authors' loss took them
    projected = text_phase_trainable(bundle, t.text_trains, sampler.all_texts(), info.world_size, unit)
    if projected is not None:
        described["tower_outputs_precomputed"] = len(projected)
    described["features"] = t.pretrain_features
    learned = t.pretrain_pairs == "as_published"  # the authors train the model's logit scale in this phase
    if learned:
        bundle.model.logit_scale.requires_grad_(True)
    bundle.model.train()
    module = wrap(Towers(bundle.model), info)
    stepper = make_stepper(setup, state, bundle, module, t.pretrain_lr, total, "pretrain", ckpt)
    per = sampler.batch_size // info.world_size
    part = slice(info.rank * per, (info.rank + 1) * per)
    # the run's tau (the run's objective options are not its), or the model's learned scale
    align = TextAlignment({"tau": setup.spec["run"]["tau"]},
                          logit_scale=(lambda: bundle.model.logit_scale) if learned else None, normalize=unit)

    def loss(pair: tuple[list[str], list[str]]) -> dict[str, torch.Tensor]:
        captions, targets = pair
        if projected is not None:
            text = projected(captions[part] + targets[part])
        else:
            _, text = module(None, bundle.tokenizer(captions[part] + targets[part]).to(setup.device), normalize=unit)
        return align(text[:per], text[per:])

    announce(setup, state, f"text pretraining (text {t.text_trains})", len(sampler), t.pretrain_epochs,
             "distinct targets")
    return Phase("pretrain", "text pretraining", t.pretrain_epochs, len(sampler),
                 _sequential(sampler.batch, len(sampler)), loss, align, stepper, losses="pretrain_losses",
                 keep_epoch_weights=False)


def re_alignment(setup: RunSetup, state: TrainState, bundle: ClipModel,
                 ckpt: dict[str, Any] | None) -> Phase:
    """The HierarCaps RE alignment (re_run.py): the text side alone, on the items its options.data names."""
    t, objective = setup.t, setup.objective
    o = objective.options  # the run entry's options (REOptions)
    items, described = setup.inputs.re_items_for(o.data)  # prepared with the inputs (cglib.prepare)
    sampler = REBatchSampler(items, o.batch_size, setup.run.train_seed)
    per_epoch = len(sampler)
    re_info = {**described, **sampler.describe(), "epochs": o.epochs, "lr": o.lr,
               "weights": {"mean": o.w_mean, "minimax": o.w_minimax, "reg": o.w_reg},
               "regularizer": "embeddings of the starting text tower (eval mode), computed once"}
    state.described.update(re_training=re_info, sampler={**re_info, "optimizer_steps_per_epoch": per_epoch})
    # the frozen original tower: every text embedded once by the starting weights (a resumed run rebuilds them)
    texts = sampler.all_texts()
    original = bundle
    if ckpt is not None:
        original = setup.files.fresh_model()
        original.model.to(setup.device)
    frozen = torch.from_numpy(encode_texts(original, texts)).to(setup.device)
    objective.reference(frozen, {text: k for k, text in enumerate(texts)})
    state.described["precomputed_texts"] = len(texts)
    projected = text_phase_trainable(bundle, t.text_trains, [*texts, ""], setup.info.world_size)
    # eval mode: no dropout, as in HierarCaps' CLIP (whose towers have none); with a dropout tower (MiniLM:
    # 0.1) train mode would make the regularizer compare noisy embeddings with clean ones (reg > 0 at step 1)
    bundle.model.eval()
    module = wrap(Towers(bundle.model), setup.info)
    stepper = make_stepper(setup, state, bundle, module, o.lr, o.epochs * per_epoch, "re", ckpt)
    announce(setup, state, f"RE alignment (text {t.text_trains})", per_epoch, o.epochs,
             f"options.data: {o.data}, {len(items)} items, batch {sampler.batch_size}")

    def embed(texts: list[str]) -> torch.Tensor:
        if projected is not None:
            return projected(texts)
        return module(None, tokenize(bundle, texts).to(setup.device))[1]

    return Phase("re", "RE", o.epochs, per_epoch, _sequential(sampler.batch, per_epoch),
                 lambda batch: objective(embed, batch), objective, stepper,
                 log=lambda items, result: {f"re_{k}": result[k] for k in LOSS_PARTS})


def image_text(setup: RunSetup, state: TrainState, bundle: ClipModel,
               ckpt: dict[str, Any] | None) -> Phase:
    """The run's objective on MAGIC group batches (or n-gram groups); the objective is set up here."""
    t, info, objective = setup.t, setup.info, setup.objective
    sampler = GroupBatchSampler(setup.inputs.magic, t.groups_per_batch, t.pairs_per_group, setup.run.train_seed,
                                text_source(setup.params, setup.entry), set(setup.inputs.cache.image_ids),
                                epoch=t.epoch)
    if t.groups_per_batch % info.world_size:
        raise ValueError(f"train.groups_per_batch ({t.groups_per_batch}) must be divisible by the number of "
                         f"processes ({info.world_size}) so every rank holds whole groups")
    objective.check(setup.params, setup.entry)
    described = state.described["sampler"] = {
        **sampler.describe(), "optimizer_steps_per_epoch": math.ceil(len(sampler) / t.grad_accum),
        "group_source": setup.entry.groups}
    if setup.inputs.groups == "ngram":
        described["ngram"] = {k: v for k, v in setup.inputs.magic.stats.get("ngram", {}).items()
                              if k not in ("too_frequent", "aliases", "removed_from_l1")}
    resumed = None if ckpt is None or ckpt["stepper"] is None else ckpt.get("objective")
    objective.setup(Setup(bundle, functools.partial(start_model, setup, state, bundle), sampler, setup.inputs,
                          setup.params, setup.entry, setup.run.train_seed, t.epochs, setup.device, resumed,
                          state.progress.step))
    set_trainable(bundle, image=True, text=not setup.params.model.freeze_text)
    bundle.model.train()
    text_rows, table = None, None
    if setup.params.model.freeze_text:  # a frozen text side: every text a batch can hold, embedded once
        extra = objective.replacement_texts()
        texts = sorted(set(sampler.all_texts()) | extra) if extra else sampler.all_texts()
        table = torch.from_numpy(encode_texts(bundle, texts, normalize=objective.unit_features)).to(setup.device)
        text_rows = {text: k for k, text in enumerate(texts)}
    state.described["precomputed_texts"] = 0 if table is None else len(table)
    module = wrap(GroupTask(bundle, objective, table, t.mask_identical_texts), info)
    per_epoch = described["optimizer_steps_per_epoch"]
    stepper = make_stepper(setup, state, bundle, module, t.lr, t.epochs * per_epoch, "train", ckpt, objective)
    empty = described.get("dropped_as_published", {}).get("expected_empty_steps_per_epoch")
    how = f"train.epoch: {t.epoch}, {described['training_pairs']} training pairs{objective.announce()}"
    if empty:
        how += f", about {empty} empty steps an epoch, skipped as the authors' loop does"
    announce(setup, state, "image-text", per_epoch, t.epochs, how)

    crops = None
    if t.augment != "none":  # open_clip's training crops, drawn per batch from the run's training seed
        crops = setup.inputs.crops
        if crops is None:
            raise ValueError("train.augment: open_clip_train needs the images' crop cache; load the inputs with "
                             "these params (cglib.prepare.load_inputs builds it)")
        described["augment"] = {"transform": t.augment, "crop_cache": crops.directory.name, "images": len(crops)}

    def batches(epoch: int, first: int) -> Iterator[dict[str, Any]]:
        data = GroupBatchData(sampler, setup.inputs.cache, epoch, first, info, text_rows, bundle.tokenizer,
                              objective.pair_replacements(), crops, setup.run.train_seed)
        return batch_loader(data, t.num_workers, setup.device)

    return Phase("train", "image-text", t.epochs, len(sampler), batches, module, objective, stepper,
                 micro_batches=t.grad_accum, image_text=True,
                 log=lambda items, result: {"fallback_groups": sum(item["fallback_groups"] for item in items),
                                            "repeated_images": sum(item["repeated_images"] for item in items)},
                 empty=lambda item: item.get("empty", False))
