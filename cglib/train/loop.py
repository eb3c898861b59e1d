"""Fine-tune a CLIP model on MAGIC group batches with one objective per run (`train.runs`).

One run = optional textual pretraining (pretrain.py), then `train.epochs` image-text epochs over group batches
(sampler.py), each step: encode the batch's images (and texts, unless the text tower is frozen), the run's loss
from `cglib.losses`, AdamW with warmup-cosine, AMP, clipping at `train.grad_clip`, `train.grad_accum`
batches per optimizer step.

Objectives (`train.runs[i].loss`): "clip" is CLIP's InfoNCE over the flattened M*N pairs of the group batch
(the fine-tuned-CLIP baseline: another pair of the same group is a negative, even when it carries the same
generalized caption); "pairwise" (Eqs. 1-4) and "centroid" (Eqs. 5-8) take tau, tau_inner, alpha and the
variant options (alpha_on, normalize_products) from the run entry or `train`.

Temperature. Every loss uses the fixed `train.tau` / `train.tau_inner` (paper: 0.1, not learned), for the CLIP
baseline too, so the three objectives differ only in their grouping. `model.logit_scale` is read by no loss:
it is frozen at its initial value (DDP requires a gradient for every trainable parameter) and saved unchanged;
retrieval ranks by cosine, which it does not affect.

Frozen text tower. With `model.freeze_text` the text side is a fixed function, so the embeddings of every text
a batch can hold are computed once per run (eval mode) and looked up per step: a step then runs the image
tower only.

Outputs under `<run>/training/` (a contract evaluation and visualization rely on):
    initial.safetensors (+ initial.json)  weights before training, same seed for every run ("zero-shot")
    <name>/final.safetensors              weights after training
    <name>/log.csv                        one row per optimizer step (LOG_COLUMNS)
    <name>/summary.json                   run spec, loss, pretrain, exposed_to_eval_strings, steps, wall time,
                                          images/s, sampler counts, provenance
    <name>/checkpoints/last.pt            full state at the last epoch end or interruption (removed when done)
    <name>/checkpoints/epoch-XXX.safetensors  weights after each epoch
    <name>/tensorboard/                   TensorBoard events
"""

from __future__ import annotations

import copy
import csv
import functools
import hashlib
import logging
import math
import shutil
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from cglib import losses
from cglib.config import Params, TrainRunParams
from cglib.data.dataset import CaptionDataset
from cglib.data.image_cache import ImageCache, build_image_cache, open_image_cache
from cglib.frontend import tqdm  # tqdm.auto live, a text bar left at its final count headless
from cglib.magic.schema import MagicFile, load_magic
from cglib.models import (
    ClipModel,
    Towers,
    build_model,
    encode_texts,
    load_weights,
    pixels_to_tensor,
    save_weights,
)
from cglib.run import RunContext, provenance, seed_everything, write_json
from cglib.train import distributed
from cglib.train.checkpoint import LAST, load_checkpoint, rng_state, save_checkpoint, set_rng_state, spec_hash
from cglib.train.distributed import DistInfo
from cglib.train.optim import amp_dtype, build_optimizer, warmup_cosine
from cglib.train.pretrain import TextPairSampler, exposed_to_eval_strings
from cglib.train.sampler import GroupBatchSampler

logger = logging.getLogger(__name__)

LOG_COLUMNS = ["phase", "epoch", "step", "global_step", "loss", "inner", "outer", "lr", "grad_norm",
               "images_per_s", "data_wait_s", "step_s", "fallback_groups", "repeated_images", "wall_s"]
INITIAL = "initial.safetensors"
ZERO_SHOT = "zero-shot"
CHECKPOINT_VERSION = 1


# ------------------------------------------------------------------------------------------------ inputs
@dataclass
class TrainInputs:
    """What every run of a params file reads: the MAGIC file and the image cache of its images."""

    magic: MagicFile
    cache: ImageCache
    fingerprint: str  # hash of magic.json and the cache key: a checkpoint of other data is not resumed


def image_cache_dir(run: RunContext) -> Path:
    """Where a run keeps its decoded-image caches (shared by training, evaluation and visualization)."""
    return run.dir / "cache" / "images"


def magic_image_cache(run: RunContext, magic: MagicFile, dataset: CaptionDataset, size: int,
                      progress: bool = True, info: DistInfo | None = None) -> ImageCache:
    """The image cache of the MAGIC images (both splits) at `size`; built by rank 0, opened by the others."""
    known = set(dataset.image_ids)
    missing = [i for i in magic.images if i not in known]
    if missing:
        raise ValueError(f"{len(missing)} MAGIC images are not in the captions dataset (first: {missing[0]}); "
                         "re-run 03_magic_dag on the current captions")
    wanted = set(magic.images)
    subset = dataset.subset([i for i in dataset.image_ids if i in wanted])
    info = info or DistInfo()
    if info.is_main:
        cache = build_image_cache(subset, size, image_cache_dir(run), progress=progress)
    distributed.barrier(info)
    if not info.is_main:
        cache = open_image_cache(subset, size, image_cache_dir(run))
        if cache is None:
            raise RuntimeError("rank 0 did not leave a complete image cache; check its log")
    return cache


def load_inputs(run: RunContext, image_size: int | None = None, progress: bool = True,
                info: DistInfo | None = None) -> TrainInputs:
    """magic.json, and the image cache of its images at `image_size` (default: the model's input size)."""
    image_size = image_size or model_image_size(run.params)
    magic_path = run.require("magic/magic.json", "03_magic_dag")
    dataset_dir = run.require("captions/dataset.json", "01_captions").parent
    magic = load_magic(magic_path)
    cache = magic_image_cache(run, magic, CaptionDataset.load(dataset_dir), image_size, progress, info)
    digest = hashlib.sha1(magic_path.read_bytes())
    digest.update(cache.directory.name.encode())
    return TrainInputs(magic, cache, digest.hexdigest()[:16])


# ------------------------------------------------------------------------------------------------- specs
def run_entry(params: Params, name: str) -> TrainRunParams:
    """The train.runs entry called `name` (ValueError listing the names otherwise)."""
    for entry in params.train.runs:
        if entry.name == name:
            return entry
    raise ValueError(f"no run named {name!r} in train.runs; choose one of {[r.name for r in params.train.runs]}")


def run_spec(params: Params, entry: TrainRunParams) -> dict[str, Any]:
    """Everything that determines a run's result: the run entry with its effective tau/alpha, train, model, seed."""
    t = params.train
    spec = entry.model_dump(mode="json")
    spec.update(tau=entry.tau or t.tau, tau_inner=entry.tau_inner or t.tau_inner,
                alpha=t.alpha if entry.alpha is None else entry.alpha)
    train = t.model_dump(mode="json", exclude={"runs", "resume", "num_workers", "log_every"})
    return {"run": spec, "train": train, "model": params.model.model_dump(mode="json"), "seed": params.run.seed}


def batch_loss(loss: str, image: torch.Tensor, text: torch.Tensor, spec: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The run's objective on (M, N, L) features: {loss} for clip, {loss, inner, outer} for the group losses."""
    if loss == "clip":
        return {"loss": losses.clip_loss(image, text, tau=spec["tau"])}
    if loss == "pairwise":
        return losses.pairwise_group_loss(image, text, spec["tau"], spec["tau_inner"], spec["alpha"],
                                          alpha_on=spec["alpha_on"], normalize_products=spec["normalize_products"],
                                          return_parts=True)
    if loss == "centroid":
        return losses.centroid_group_loss(image, text, spec["tau"], spec["tau_inner"], spec["alpha"],
                                          alpha_on=spec["alpha_on"], return_parts=True)
    raise ValueError(f"unknown loss {loss!r}; use clip, pairwise or centroid")


# ---------------------------------------------------------------------------------------------- batches
class GroupBatchData(torch.utils.data.Dataset):
    """Batches of one epoch from position `start`, as tensors: uint8 pixels plus text rows or tokens.

    Each rank keeps its own groups; a DataLoader may run this in worker processes (the cache is a memmap).
    """

    def __init__(self, sampler: GroupBatchSampler, cache: ImageCache, epoch: int, start: int, info: DistInfo,
                 text_rows: dict[str, int] | None, tokenizer: Callable | None) -> None:
        self.sampler, self.cache, self.epoch, self.start, self.info = sampler, cache, epoch, start, info
        self.text_rows, self.tokenizer = text_rows, tokenizer

    def __len__(self) -> int:
        return len(self.sampler) - self.start

    def __getitem__(self, i: int) -> dict[str, Any]:
        full = self.sampler.batch(self.epoch, self.start + i)
        batch = full.shard(self.info.rank, self.info.world_size)
        m, n = batch.shape
        ids = [image_id for row in batch.image_ids for image_id in row]
        texts = [t for row in batch.texts for t in row]
        item: dict[str, Any] = {"pixels": torch.from_numpy(self.cache.get(ids)), "m": m, "n": n,
                                "index": self.start + i, "fallback_groups": full.n_fallback,
                                "repeated_images": full.repeated_images, "global_images": len(full.groups) * n}
        if self.text_rows is not None:
            item["text_rows"] = torch.tensor([self.text_rows[t] for t in texts], dtype=torch.long)
        else:  # trainable text tower: tokenize each distinct text once
            unique = sorted(set(texts))
            where = {t: k for k, t in enumerate(unique)}
            item["tokens"] = self.tokenizer(unique)
            item["text_inverse"] = torch.tensor([where[t] for t in texts], dtype=torch.long)
        return item


def _loader(dataset: torch.utils.data.Dataset, num_workers: int, device: torch.device) -> Iterator[dict[str, Any]]:
    """Iterate a batch dataset; a private generator keeps the global RNG untouched (exact resume)."""
    return iter(torch.utils.data.DataLoader(dataset, batch_size=None, shuffle=False, num_workers=num_workers,
                                            pin_memory=device.type == "cuda", generator=torch.Generator()))


# ---------------------------------------------------------------------------------------------- stepping
@contextmanager
def _defer_interrupt() -> Iterator[None]:
    """Hold Ctrl-C during a parameter update so a checkpoint never sees half-updated weights."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[Any] = []
    previous = signal.signal(signal.SIGINT, lambda *args: caught.append(args))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


class Stepper:
    """AdamW + warmup-cosine + AMP + clipping + accumulation for one phase; `step` is one optimizer step."""

    def __init__(self, model: torch.nn.Module, module: torch.nn.Module, *, lr: float, weight_decay: float,
                 warmup_steps: int, total_steps: int, amp: torch.dtype | None, grad_clip: float,
                 device: torch.device) -> None:
        self.module, self.amp, self.grad_clip, self.device = module, amp, grad_clip, device
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = build_optimizer(model, lr, weight_decay)
        self.scheduler = warmup_cosine(self.optimizer, warmup_steps, total_steps)
        # fp16 needs loss scaling; bf16 and fp32 do not (the scaler is then a no-op that still saves its state)
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None)

    def step(self, items: list[Any], loss_fn: Callable[[Any], dict[str, torch.Tensor]],
             on_update: Callable[[dict[str, float]], None] | None = None) -> dict[str, float]:
        """Accumulate gradients over `items` (one micro-batch each), clip, update; mean loss parts and lr.

        `on_update(result)` runs inside the same Ctrl-C-proof section as the update, so bookkeeping (position,
        RNG snapshot) always matches the weights: an interruption lands before or after a whole step.
        """
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, torch.Tensor] = {}
        ddp = isinstance(self.module, DistributedDataParallel)
        for k, item in enumerate(items):
            sync = k == len(items) - 1
            with self.module.no_sync() if ddp and not sync else nullcontext():
                with self.autocast():
                    parts = loss_fn(item)
                self.scaler.scale(parts["loss"] / len(items)).backward()
            for key, value in parts.items():
                totals[key] = totals.get(key, 0.0) + value.detach().float() / len(items)
        lr = self.scheduler.get_last_lr()[0]
        with _defer_interrupt():
            self.scaler.unscale_(self.optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.scheduler.step()
            result = {**{k: float(v) for k, v in totals.items()}, "grad_norm": float(grad_norm), "lr": lr}
            if on_update is not None:
                on_update(result)
        return result

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])


def wrap(towers: Towers, info: DistInfo) -> torch.nn.Module:
    """DDP around the encoders when running under torchrun, else the encoders themselves."""
    if not info.distributed:
        return towers
    ids = [info.device.index] if info.device.type == "cuda" else None
    return DistributedDataParallel(towers, device_ids=ids)


def group_step_loss(module: torch.nn.Module, bundle: ClipModel, item: dict[str, Any], run: dict[str, Any],
                    text_table: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """Loss of one group batch item (as built by GroupBatchData) on this rank's groups."""
    device = bundle.device
    images = pixels_to_tensor(item["pixels"].to(device, non_blocking=True), bundle)
    tokens = None if text_table is not None else item["tokens"].to(device, non_blocking=True)
    image, text = module(images, tokens)
    if text_table is not None:
        text = text_table[item["text_rows"].to(device)]
    else:
        text = text[item["text_inverse"].to(device)]
    m, n = item["m"], item["n"]
    return batch_loss(run["loss"], image.reshape(m, n, -1), text.reshape(m, n, -1), run)


def set_trainable(bundle: ClipModel, image: bool, text: bool) -> None:
    """Which towers train in a phase; logit_scale is always frozen (fixed tau, see module docstring)."""
    for p in bundle.model.parameters():
        p.requires_grad_(image)
    bundle.set_text_trainable(text)
    bundle.freeze_logit_scale()


# ------------------------------------------------------------------------------------------------ logging
class RunLog:
    """Per-step CSV rows and TensorBoard scalars; on resume, rows after the checkpoint are dropped."""

    def __init__(self, out: Path, enabled: bool, resume_global_step: int | None, log_every: int) -> None:
        self.enabled, self.log_every = enabled, log_every
        self.path = out / "log.csv"
        self.window: dict[str, list[float]] = {}
        self.writer = None
        if not enabled:
            return
        keep: list[dict[str, str]] = []
        if resume_global_step is not None and self.path.is_file():
            with self.path.open(newline="", encoding="utf-8") as f:
                keep = [r for r in csv.DictReader(f) if int(r["global_step"]) <= resume_global_step]
        with self.path.open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, LOG_COLUMNS)
            w.writeheader()
            w.writerows(keep)
        self.file = self.path.open("a", newline="", encoding="utf-8")
        self.csv = csv.DictWriter(self.file, LOG_COLUMNS)
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out / "tensorboard"), purge_step=(resume_global_step or 0) + 1)

    def row(self, row: dict[str, Any]) -> None:
        """Append one step's row; every `log_every` steps write window means to TensorBoard."""
        if not self.enabled:
            return
        self.csv.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()})
        for key in ("loss", "inner", "outer", "lr", "grad_norm", "images_per_s", "data_wait_s"):
            if isinstance(row.get(key), float) and not math.isnan(row[key]):
                self.window.setdefault(key, []).append(row[key])
        if row["global_step"] % self.log_every == 0:
            self.file.flush()
            for key, values in self.window.items():
                self.writer.add_scalar(f"{row['phase']}/{key}", float(np.mean(values)), row["global_step"])
            self.window = {}

    def close(self) -> None:
        if self.enabled:
            self.file.close()
            self.writer.close()


# --------------------------------------------------------------------------------------------- the run
@dataclass
class _Progress:
    """Position and counters of a run (all saved in the checkpoint)."""

    phase: str = "pretrain"
    epoch: int = 0
    batch: int = 0  # next batch index within the epoch
    step: int = 0  # optimizer steps done in this phase
    global_step: int = 0  # optimizer steps over both phases
    pretrain_steps: int = 0
    wall_s: float = 0.0
    images: int = 0
    data_wait_s: float = 0.0
    compute_s: float = 0.0
    fallback_batches: int = 0
    repeated_images: int = 0
    epoch_losses: list[float] = field(default_factory=list)
    epoch_sum: float = 0.0
    epoch_count: int = 0
    pretrain_losses: list[float] = field(default_factory=list)

    def state(self) -> dict[str, Any]:
        return dict(self.__dict__)


class _Trainer:
    """One train.runs entry from start (or its checkpoint) to final weights and summary."""

    def __init__(self, run: RunContext, entry: TrainRunParams, inputs: TrainInputs, info: DistInfo,
                 on_step: Callable[[dict[str, Any]], None] | None, progress: bool) -> None:
        self.run, self.entry, self.inputs, self.info = run, entry, inputs, info
        self.params, self.t = run.params, run.params.train
        self.spec = run_spec(run.params, entry)
        self.hash = spec_hash({**self.spec, "data": inputs.fingerprint})
        self.on_step, self.progress = on_step, progress
        self.out = run.stage("training") / entry.name
        self.ckpt_dir = self.out / "checkpoints"
        self.device = info.device
        self.amp = amp_dtype(self.t.amp, self.device)
        self.state = _Progress(phase="pretrain" if entry.pretrain != "none" else "train")
        # (progress, rng, stepper) at the last completed optimizer step: weights and optimizer only change inside
        # Stepper's Ctrl-C-proof update, so together with them this is an exact checkpoint at any interruption
        self.boundary: tuple[dict[str, Any], dict[str, Any], Stepper | None] | None = None
        self.resumed_from: int | None = None
        self.warmup_used: dict[str, int] = {}

    # ------------------------------------------------------------------------------------ setup
    def _fresh_model(self) -> ClipModel:
        model_params = self.params.model.model_copy(update={"pretrained": None, "checkpoint": None})
        bundle = build_model(model_params, "cpu")
        load_weights(bundle.model, self.run.stage("training") / INITIAL)
        return bundle

    def _load_checkpoint(self) -> dict[str, Any] | None:
        path = self.ckpt_dir / LAST
        if not self.t.resume or not path.is_file():
            return None
        state = load_checkpoint(path)
        if state.get("version") != CHECKPOINT_VERSION or state.get("spec_hash") != self.hash:
            warnings.warn(f"{path} was written for other params or data; starting run {self.entry.name!r} "
                          "from scratch (its old outputs are replaced)", stacklevel=3)
            return None
        return state

    def _clear_outputs(self) -> None:
        if self.info.is_main:
            for name in ("log.csv", "summary.json", "final.safetensors"):
                (self.out / name).unlink(missing_ok=True)
            for name in ("tensorboard", "checkpoints"):
                shutil.rmtree(self.out / name, ignore_errors=True)
        distributed.barrier(self.info)

    def _mark(self, stepper: Stepper | None) -> None:
        """Remember the position after a completed optimizer step (cheap: counters and RNG, no weights)."""
        self.state.wall_s = self.clock()
        self.boundary = (copy.deepcopy(self.state.state()), rng_state(), stepper)

    def _save_boundary(self) -> None:
        """Write the full checkpoint of the last completed step (rank 0)."""
        if self.boundary is None or not self.info.is_main:
            return
        progress, rng, stepper = self.boundary
        save_checkpoint(self.ckpt_dir / LAST, {
            "version": CHECKPOINT_VERSION, "spec_hash": self.hash, "progress": progress,
            "model": {k: v.detach().cpu() for k, v in self.bundle.model.state_dict().items()},
            "stepper": None if stepper is None else stepper.state_dict(), "rng": rng})

    # ------------------------------------------------------------------------------------ main
    def __call__(self) -> dict[str, Any]:
        seed_everything(self.params.run.seed)
        ckpt = self._load_checkpoint()
        if ckpt is None:
            self._clear_outputs()
        self.out.mkdir(parents=True, exist_ok=True)
        self.bundle = self._fresh_model()
        if ckpt is not None:
            self.bundle.model.load_state_dict(ckpt["model"])
            self.state = _Progress(**ckpt["progress"])
            self.resumed_from = self.state.global_step
            logger.info("resuming %s at %s epoch %d batch %d", self.entry.name, self.state.phase,
                        self.state.epoch, self.state.batch)
        self.bundle.model.to(self.device)
        self.log = RunLog(self.out, self.info.is_main, self.resumed_from, self.t.log_every)
        started = time.perf_counter() - self.state.wall_s
        self.clock = lambda: time.perf_counter() - started
        try:
            if self.state.phase == "pretrain":
                self._pretrain(ckpt)
                ckpt = None
            self._train(ckpt)
        except KeyboardInterrupt:
            self._save_boundary()
            if self.boundary is not None:
                logger.warning("interrupted: run %s saved after step %d; run again to resume",
                               self.entry.name, self.boundary[0]["global_step"])
            raise
        finally:
            self.log.close()
        return self._finish()

    def _warmup(self, total: int, phase: str) -> int:
        """train.warmup_steps, or a tenth of a phase too short for it (warned and recorded in the summary)."""
        warmup = self.t.warmup_steps
        if phase == "pretrain":  # the text phase is short: its warmup is at most a tenth of it
            warmup = min(warmup, total // 10)
        elif warmup >= total:
            warmup = total // 10
            warnings.warn(f"train.warmup_steps ({self.t.warmup_steps}) >= the run's {total} optimizer steps; "
                          f"warming up over {warmup} steps instead", stacklevel=2)
        self.warmup_used[phase] = warmup
        return warmup

    def _resume_stepper(self, stepper: Stepper, ckpt: dict[str, Any] | None) -> None:
        if ckpt is not None:
            if ckpt["stepper"] is not None:  # None: saved between phases, the new phase starts a fresh optimizer
                stepper.load_state_dict(ckpt["stepper"])
            set_rng_state(ckpt["rng"])

    def _bar(self, total: int, phase: str):
        return tqdm(total=total, initial=self.state.step, desc=f"{self.entry.name} {phase}",
                    disable=not (self.progress and self.info.is_main), leave=True)

    def _record(self, epoch: int, result: dict[str, float], images: int, wait: float, step_s: float,
                extra: dict[str, Any]) -> None:
        row = {"phase": self.state.phase, "epoch": epoch, "step": self.state.step,
               "global_step": self.state.global_step, "loss": result["loss"],
               "inner": result.get("inner", float("nan")), "outer": result.get("outer", float("nan")),
               "lr": result["lr"], "grad_norm": result["grad_norm"],
               "images_per_s": images / max(step_s, 1e-9) if images else float("nan"),
               "data_wait_s": wait, "step_s": step_s, "wall_s": round(self.clock(), 3), **extra}
        self.log.row({k: row.get(k, "") for k in LOG_COLUMNS})
        if self.on_step is not None:
            self.on_step(row)

    # ------------------------------------------------------------------------------------ phase 1
    def _pretrain(self, ckpt: dict[str, Any] | None) -> None:
        sampler = TextPairSampler(self.inputs.magic, self.entry.pretrain, self.t.pretrain_batch_size,
                                  self.params.run.seed)
        if sampler.batch_size % self.info.world_size:
            raise ValueError(f"train.pretrain_batch_size ({sampler.batch_size}) must be divisible by the number "
                             f"of processes ({self.info.world_size})")
        self.pretrain_info = sampler.describe()
        total = self.t.pretrain_epochs * len(sampler)
        stepper = None
        if total:
            set_trainable(self.bundle, image=False, text=True)
            self.bundle.model.train()
            module = wrap(Towers(self.bundle.model), self.info)
            stepper = Stepper(self.bundle.model, module, lr=self.t.pretrain_lr, weight_decay=self.t.weight_decay,
                              warmup_steps=self._warmup(total, "pretrain"), total_steps=total,
                              amp=self.amp, grad_clip=self.t.grad_clip, device=self.device)
            self._resume_stepper(stepper, ckpt)
            self._pretrain_epochs(sampler, module, stepper, total)
        s = self.state
        s.pretrain_steps, s.phase, s.epoch, s.batch, s.step = s.step, "train", 0, 0, 0
        self._mark(None)
        self._save_boundary()

    def _pretrain_epochs(self, sampler: TextPairSampler, module: torch.nn.Module, stepper: Stepper,
                         total: int) -> None:
        per = sampler.batch_size // self.info.world_size
        part = slice(self.info.rank * per, (self.info.rank + 1) * per)
        tau = self.spec["run"]["tau"]

        def loss_fn(pair: tuple[list[str], list[str]]) -> dict[str, torch.Tensor]:
            captions, targets = pair
            tokens = self.bundle.tokenizer(captions[part] + targets[part]).to(self.device)
            _, text = module(None, tokens)
            return {"loss": losses.text_alignment_loss(text[:per], text[per:], tau=tau)}

        def advance(result: dict[str, float]) -> None:
            s = self.state
            s.batch, s.step, s.global_step = s.batch + 1, s.step + 1, s.global_step + 1
            s.epoch_sum, s.epoch_count = s.epoch_sum + result["loss"], s.epoch_count + 1
            if s.batch == len(sampler):
                s.pretrain_losses.append(s.epoch_sum / max(1, s.epoch_count))
                s.epoch, s.batch, s.epoch_sum, s.epoch_count = s.epoch + 1, 0, 0.0, 0
            self._mark(stepper)

        bar = self._bar(total, "text pretraining")
        while self.state.epoch < self.t.pretrain_epochs:
            epoch = self.state.epoch
            tick = time.perf_counter()
            pair = sampler.batch(epoch, self.state.batch)
            wait = time.perf_counter() - tick
            result = stepper.step([pair], loss_fn, advance)
            self._record(epoch, result, 0, wait, time.perf_counter() - tick, {})
            bar.update(1)
        bar.close()

    # ------------------------------------------------------------------------------------ phase 2
    def _advance(self, stepper: Stepper, items: list[dict[str, Any]], images: int, wait: float, tick: float,
                 result: dict[str, float]) -> None:
        """Count a completed image-text optimizer step (called inside the update's Ctrl-C-proof section)."""
        s = self.state
        s.batch, s.step, s.global_step = s.batch + len(items), s.step + 1, s.global_step + 1
        s.images += images
        s.data_wait_s += wait
        s.compute_s += time.perf_counter() - tick - wait
        s.fallback_batches += sum(1 for item in items if item["fallback_groups"])
        s.repeated_images += sum(item["repeated_images"] for item in items)
        s.epoch_sum, s.epoch_count = s.epoch_sum + result["loss"], s.epoch_count + 1
        self._mark(stepper)

    def _text_table(self, sampler: GroupBatchSampler) -> tuple[dict[str, int] | None, torch.Tensor | None]:
        if not self.params.model.freeze_text:
            return None, None
        texts = sampler.all_texts()
        table = torch.from_numpy(encode_texts(self.bundle, texts)).to(self.device)
        return {t: k for k, t in enumerate(texts)}, table

    def _train(self, ckpt: dict[str, Any] | None) -> None:
        t, info = self.t, self.info
        sampler = GroupBatchSampler(self.inputs.magic, t.groups_per_batch, t.pairs_per_group,
                                    self.params.run.seed, t.text_source, set(self.inputs.cache.image_ids))
        if t.groups_per_batch % info.world_size:
            raise ValueError(f"train.groups_per_batch ({t.groups_per_batch}) must be divisible by the number of "
                             f"processes ({info.world_size}) so every rank holds whole groups")
        if self.entry.loss != "clip" and t.groups_per_batch < 2:
            raise ValueError(f"the {self.entry.loss} loss contrasts groups: set train.groups_per_batch >= 2")
        self.sampler_info = sampler.describe()
        total = t.epochs * math.ceil(len(sampler) / t.grad_accum)
        set_trainable(self.bundle, image=True, text=not self.params.model.freeze_text)
        self.bundle.model.train()
        text_rows, table = self._text_table(sampler)
        self.n_precomputed = 0 if table is None else len(table)
        module = wrap(Towers(self.bundle.model), info)
        stepper = Stepper(self.bundle.model, module, lr=t.lr, weight_decay=t.weight_decay,
                          warmup_steps=self._warmup(total, "train"), total_steps=total, amp=self.amp, grad_clip=t.grad_clip,
                          device=self.device)
        self._resume_stepper(stepper, ckpt)
        spec = self.spec["run"]

        def loss_fn(item: dict[str, Any]) -> dict[str, torch.Tensor]:
            return group_step_loss(module, self.bundle, item, spec, table)

        bar = self._bar(total, "image-text")
        while self.state.epoch < t.epochs:
            data = GroupBatchData(sampler, self.inputs.cache, self.state.epoch, self.state.batch, info, text_rows,
                                  self.bundle.tokenizer)
            batches = _loader(data, t.num_workers, self.device)
            while self.state.batch < len(sampler):
                tick = time.perf_counter()
                items = [next(batches) for _ in range(min(t.grad_accum, len(sampler) - self.state.batch))]
                wait = time.perf_counter() - tick
                images = sum(item["global_images"] for item in items)
                extra = {"fallback_groups": sum(item["fallback_groups"] for item in items),
                         "repeated_images": sum(item["repeated_images"] for item in items)}

                advance = functools.partial(self._advance, stepper, items, images, wait, tick)
                result = stepper.step(items, loss_fn, advance)
                self._record(self.state.epoch, result, images, wait, time.perf_counter() - tick, extra)
                bar.update(1)
                if self.state.step % t.log_every == 0:
                    bar.set_postfix(loss=f"{result['loss']:.4f}", lr=f"{result['lr']:.2e}")
            with _defer_interrupt():
                s = self.state
                s.epoch_losses.append(s.epoch_sum / max(1, s.epoch_count))
                s.epoch, s.batch, s.epoch_sum, s.epoch_count = s.epoch + 1, 0, 0.0, 0
                self._mark(stepper)
            self._save_boundary()
            if info.is_main:
                save_weights(self.bundle.model, self.ckpt_dir / f"epoch-{s.epoch:03d}.safetensors")
        bar.close()

    # ------------------------------------------------------------------------------------ outputs
    def _finish(self) -> dict[str, Any]:
        s, entry = self.state, self.entry
        summary = {
            "name": entry.name, "loss": entry.loss, "pretrain": entry.pretrain,
            "exposed_to_eval_strings": exposed_to_eval_strings(entry.pretrain),
            "spec": self.spec, "spec_hash": self.hash, "data_fingerprint": self.inputs.fingerprint,
            "epochs": self.t.epochs, "steps": s.step, "pretrain_steps": s.pretrain_steps,
            "images_seen": s.images, "wall_time_s": round(self.clock(), 2),
            "images_per_s": s.images / s.compute_s if s.compute_s else None,
            "images_per_s_with_data": s.images / (s.compute_s + s.data_wait_s) if s.compute_s else None,
            "data_wait_s": round(s.data_wait_s, 3),
            "epoch_loss": s.epoch_losses, "final_loss": s.epoch_losses[-1] if s.epoch_losses else None,
            "pretrain_epoch_loss": s.pretrain_losses,
            "fallback_batches": s.fallback_batches, "repeated_images": s.repeated_images,
            "sampler": getattr(self, "sampler_info", None), "pretraining": getattr(self, "pretrain_info", None),
            "text_frozen": self.params.model.freeze_text, "precomputed_texts": getattr(self, "n_precomputed", 0),
            "tau_note": "fixed train.tau / tau_inner; model.logit_scale frozen and unused",
            "image_cache": {"size": self.inputs.cache.size, "images": len(self.inputs.cache),
                            "skipped": dict(self.inputs.cache.skipped)},
            "device": str(self.device), "world_size": self.info.world_size,
            "amp": str(self.amp).replace("torch.", "") if self.amp else "off",
            "resumed_from_step": self.resumed_from, "warmup_steps_used": self.warmup_used,
        }
        if self.info.is_main:
            save_weights(self.bundle.model, self.out / "final.safetensors")
            summary["provenance"] = provenance(self.params, run=entry.name)
            write_json(self.out / "summary.json", summary)
            (self.ckpt_dir / LAST).unlink(missing_ok=True)
        distributed.barrier(self.info)
        return summary


# ----------------------------------------------------------------------------------------------- public
def ensure_initial(run: RunContext, info: DistInfo | None = None) -> Path:
    """Save the untrained (zero-shot) weights once per model spec and seed: `training/initial.safetensors`."""
    info = info or DistInfo()
    path = run.stage("training") / INITIAL
    meta_path = path.with_suffix(".json")
    want = {"model": run.params.model.model_dump(mode="json"), "seed": run.params.run.seed}
    current = None
    if meta_path.is_file() and path.is_file():
        import json

        current = json.loads(meta_path.read_text(encoding="utf-8")).get("spec")
    if current != want and info.is_main:
        seed_everything(run.params.run.seed)
        bundle = build_model(run.params.model, "cpu")
        save_weights(bundle.model, path)
        write_json(meta_path, {"spec": want, "provenance": provenance(run.params)})
    distributed.barrier(info)
    return path


def train_one(run: RunContext, name: str, *, inputs: TrainInputs | None = None, info: DistInfo | None = None,
              on_step: Callable[[dict[str, Any]], None] | None = None, progress: bool = True) -> dict[str, Any]:
    """Train the train.runs entry `name` (resuming its checkpoint when allowed); return its summary."""
    entry = run_entry(run.params, name)
    info = info or distributed.current(run.device())
    ensure_initial(run, info)
    if inputs is None:
        inputs = load_inputs(run, progress=progress, info=info)
    out = run.stage("training") / name
    trainer = _Trainer(run, entry, inputs, info, on_step, progress)
    summary_path = out / "summary.json"
    if run.params.train.resume and summary_path.is_file() and (out / "final.safetensors").is_file():
        import json

        done = json.loads(summary_path.read_text(encoding="utf-8"))
        if done.get("spec_hash") == trainer.hash:
            logger.info("run %s is already trained with these params; reusing it", name)
            return done
    return trainer()


def model_image_size(params: Params) -> int:
    """The input size of params.model (the training image cache is built at it)."""
    if params.model.image_size is not None:
        return params.model.image_size
    from cglib.models import CGLIB_CONFIGS, DEMO_VISION, TINY_VISION

    name = params.model.name
    if name in CGLIB_CONFIGS:
        return (DEMO_VISION if name == "cglib-demo-vit" else TINY_VISION)["image_size"]
    import open_clip

    config = open_clip.get_model_config(name)
    if config is None:
        raise ValueError(f"model.name '{name}' is not an open_clip architecture (see open_clip.list_models())")
    size = config["vision_cfg"]["image_size"]
    return int(size[0] if isinstance(size, list | tuple) else size)


def train_all(run: RunContext, names: list[str] | None = None, progress: bool = True,
              info: DistInfo | None = None) -> dict[str, dict[str, Any]]:
    """Train every train.runs entry (or those named) from the same initial weights; summaries by name."""
    names = names or [r.name for r in run.params.train.runs]
    for name in names:
        run_entry(run.params, name)  # fail before any work on a typo
    info = info or distributed.current(run.device())
    ensure_initial(run, info)
    inputs = load_inputs(run, progress=progress, info=info)
    return {name: train_one(run, name, inputs=inputs, info=info, progress=progress) for name in names}


def summary_table(summaries: dict[str, dict[str, Any]]):
    """One row per run (a pandas DataFrame): objective, pretraining, exposure, steps, time, throughput, losses."""
    import pandas as pd

    rows = []
    for name, s in summaries.items():
        losses_ = s.get("epoch_loss") or [float("nan")]
        sampler = s.get("sampler") or {}
        rows.append({"run": name, "loss": s["loss"], "pretrain": s["pretrain"],
                     "exposed to eval strings": s["exposed_to_eval_strings"], "steps": s["steps"],
                     "pretrain steps": s["pretrain_steps"], "wall time (s)": s["wall_time_s"],
                     "images/s": round(s["images_per_s"] or float("nan"), 1),
                     "loss, first epoch": round(losses_[0], 4), "loss, last epoch": round(losses_[-1], 4),
                     "batches with fallback negatives": s["fallback_batches"],
                     "batches per epoch": sampler.get("batches_per_epoch")})
    return pd.DataFrame(rows).set_index("run")


def load_trained(params: Params, run_dir: str | Path, name: str, device: str = "cpu") -> ClipModel:
    """The model trained by run `name` of train.runs, or "zero-shot" (the initial weights), in eval mode."""
    base = Path(run_dir) / "training"
    if name == ZERO_SHOT:
        path = base / INITIAL
    else:
        run_entry(params, name)
        path = base / name / "final.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run notebook 05_training (or `python -m cglib.train`) first")
    bundle = build_model(params.model.model_copy(update={"pretrained": None, "checkpoint": None}), device)
    load_weights(bundle.model, path)
    bundle.model.eval()
    return bundle
