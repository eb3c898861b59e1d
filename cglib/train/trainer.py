"""One train.runs entry from start (or its checkpoint) to final weights and summary: the two phases' loops.

Phase 1 (optional) is textual pretraining (pretrain.py), phase 2 the image-text epochs over group batches
(sampler.py: `train.epoch` says what an epoch is). Positions and counters live in `Progress`; the checkpoint
of the last completed optimizer step is written at each epoch end and on an interruption (faults.py).
"""

from __future__ import annotations

import copy
import functools
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from cglib.config import TrainRunParams
from cglib.frontend import tqdm  # tqdm.auto live, a text bar left at its final count headless
from cglib.models import ClipModel, Towers, encode_texts, tokenize
from cglib.run import RunContext, seed_everything
from cglib.train.batches import GroupBatchData, batch_loader
from cglib.train.checkpoint import Progress, RunFiles
from cglib.train.distributed import DistInfo
from cglib.train.faults import checkpoint_on_signals, defer_interrupts, resolved_precision
from cglib.train.inputs import TrainInputs, run_spec, text_source
from cglib.train.objectives import Objective, Setup, TextAlignment, build_objective
from cglib.train.optim import amp_dtype
from cglib.train.pretrain import TextPairSampler
from cglib.train.released import TRAINED_HERE, load_released, released_present
from cglib.train.runlog import LOG_COLUMNS, RunLog
from cglib.train.sampler import GroupBatchSampler
from cglib.train.step import GroupTask, Stepper, set_trainable, wrap
from cglib.train.text_phase import ProjectedTexts, text_phase_trainable

logger = logging.getLogger(__name__)


class Trainer:
    """One train.runs entry from start (or its checkpoint) to final weights and summary."""

    def __init__(self, run: RunContext, entry: TrainRunParams, inputs: TrainInputs, info: DistInfo,
                 on_step: Callable[[dict[str, Any]], None] | None, progress: bool,
                 on_epoch: Callable[[int, ClipModel], None] | None = None) -> None:
        """`on_epoch(epochs_done, bundle)` is called after each image-text epoch's checkpoint (the hyper-parameter
        search scores the validation split there and may stop the run by raising)."""
        self.run, self.entry, self.inputs, self.info = run, entry, inputs, info
        self.params, self.t = run.params, run.params.train
        self.spec = run_spec(run.params, entry, run.training_seed)
        self.on_step, self.on_epoch, self.progress = on_step, on_epoch, progress
        self.device = info.device
        self.amp = amp_dtype(self.t.amp, self.device)
        self.files = RunFiles(run, entry.name, {**self.spec, "data": inputs.fingerprint}, info,
                              resolved_precision(self.device, self.amp))
        self.hash, self.out = self.files.hash, self.files.out
        # the objective's run-long state (a head, a memory) lives in it; the loop only calls its hooks
        self.objective: Objective = build_objective(run.params, entry, self.spec["run"]).to(self.device)
        if info.distributed and self.objective.distributed_refusal:
            raise ValueError(f"run {entry.name!r} (loss: {entry.loss}) cannot run under torchrun: "
                             f"{self.objective.distributed_refusal}; run it without torchrun")
        first = self.objective.phase if self.objective.phase != "train" else \
            "pretrain" if entry.pretrain != "none" else "train"
        self.state = Progress(phase=first)
        # (progress, rng, stepper) at the last completed optimizer step: weights and optimizer only change inside
        # Stepper's interrupt-proof update, so together with them this is an exact checkpoint at any interruption
        self.boundary: tuple[dict[str, Any], dict[str, Any], Stepper | None] | None = None
        self.resumed_from: int | None = None
        self.warmup_used: dict[str, int] = {}
        self.sampler_info: dict[str, Any] | None = None
        self.pretrain_info: dict[str, Any] | None = None
        self.n_precomputed = 0
        self.re_info: dict[str, Any] | None = None
        self.weights_source: dict[str, Any] = {"kind": TRAINED_HERE}
        if inputs.groups != entry.groups:
            raise ValueError(f"run {entry.name!r} trains on groups: {entry.groups}, but these inputs hold "
                             f"{inputs.groups} groups; load them with load_inputs(run, groups={entry.groups!r}) "
                             "(train_one and train_all do)")

    def _mark(self, stepper: Stepper | None) -> None:
        """Remember the position after a completed optimizer step (cheap: counters and RNG, no weights)."""
        self.state.wall_s = self.clock()
        self.boundary = (copy.deepcopy(self.state.state()), self.files.rng(), stepper)

    def _save_boundary(self) -> None:
        if self.boundary is not None:
            self.files.save_checkpoint(self.bundle, *self.boundary, objective=self.objective)

    # ------------------------------------------------------------------------------------ main
    def __call__(self) -> dict[str, Any]:
        """Train (or resume) the run; return its summary (written by summary.finish)."""
        from cglib.train.summary import finish

        seed_everything(self.run.train_seed)  # the training seed: init of anything built here
        ckpt = self.files.load_checkpoint()
        if ckpt is None:
            self.files.clear_outputs()
        self.out.mkdir(parents=True, exist_ok=True)
        self.bundle: ClipModel = self.files.fresh_model()
        self.initial = {k: v.detach().clone() for k, v in self.bundle.model.state_dict().items()}
        if ckpt is not None:
            # the checkpoint holds every key but a frozen tower's, which the initial weights already hold
            missing, unexpected = self.bundle.model.load_state_dict(ckpt["model"], strict=False)
            missing = sorted(set(missing) - set(self.files.frozen))
            if missing or unexpected:
                raise ValueError(f"{self.files.ckpt_dir / 'last.pt'} does not fit the model: missing {missing[:5]}, "
                                 f"unexpected {unexpected[:5]}; delete it (or set train.resume: false) to start over")
            self.state = Progress(**ckpt["progress"])
            self.resumed_from = self.state.global_step
            logger.info("resuming %s at %s epoch %d batch %d", self.entry.name, self.state.phase,
                        self.state.epoch, self.state.batch)
        self.bundle.model.to(self.device)
        self.log = RunLog(self.out, self.info.is_main, self.resumed_from, self.t.log_every)
        started = time.perf_counter() - self.state.wall_s
        self.clock = lambda: time.perf_counter() - started
        try:
            with checkpoint_on_signals():
                if self.state.phase == "re" and released_present(self.entry):
                    self.weights_source = load_released(self.bundle, self.entry)
                elif self.state.phase == "re":
                    self._re(ckpt)
                else:
                    if self.state.phase == "pretrain":
                        self._pretrain(ckpt)
                        ckpt = None
                    self._train(ckpt)
        except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM (faults.Terminated)
            self._save_boundary()
            if self.boundary is not None:
                logger.warning("%s: run %s saved after step %d; run again to resume",
                               type(stop).__name__ if str(stop) else "interrupted", self.entry.name,
                               self.boundary[0]["global_step"])
            raise
        finally:
            self.log.close()
        return finish(self)

    def _warmup(self, total: int, phase: str) -> int:
        """train.warmup_steps, or a tenth of a phase too short for it (warned and recorded in the summary)."""
        import warnings

        warmup = self.t.warmup_steps
        if phase in ("pretrain", "re"):  # the text phases are short: their warmup is at most a tenth of them
            warmup = min(warmup, total // 10)
        elif warmup >= total:
            warmup = total // 10
            warnings.warn(f"train.warmup_steps ({self.t.warmup_steps}) >= the run's {total} optimizer steps; "
                          f"warming up over {warmup} steps instead", stacklevel=2)
        self.warmup_used[phase] = warmup
        return warmup

    def _stepper(self, module: torch.nn.Module, lr: float, total: int, phase: str, ckpt: dict[str, Any] | None,
                 head: torch.nn.Module | None = None) -> Stepper:
        stepper = Stepper(self.bundle.model, module, lr=lr, weight_decay=self.t.weight_decay,
                          warmup_steps=self._warmup(total, phase), total_steps=total, amp=self.amp,
                          grad_clip=self.t.grad_clip, device=self.device, head=head)
        if ckpt is not None:
            if ckpt["stepper"] is not None:  # None: saved between phases, the new phase starts a fresh optimizer
                stepper.load_state_dict(ckpt["stepper"])
            self.files.set_rng(ckpt["rng"])
        return stepper

    def _bar(self, total: int, phase: str):
        return tqdm(total=total, initial=self.state.step, desc=f"{self.entry.name} {phase}",
                    disable=not (self.progress and self.info.is_main), leave=True)

    def _record(self, epoch: int, result: dict[str, float], images: int, wait: float, step_s: float,
                extra: dict[str, Any]) -> None:
        row = {"phase": self.state.phase, "epoch": epoch, "step": self.state.step,
               "global_step": self.state.global_step, "loss": result["loss"],
               "inner": result.get("inner", float("nan")), "outer": result.get("outer", float("nan")),
               "lr": result["lr"], "grad_norm": result["grad_norm"], "skipped": int(result.get("skipped", 0)),
               "images_per_s": images / max(step_s, 1e-9) if images else float("nan"),
               "data_wait_s": wait, "step_s": step_s, "wall_s": round(self.clock(), 3), **extra}
        self.log.row({k: row.get(k, "") for k in LOG_COLUMNS})
        if self.on_step is not None:
            self.on_step(row)

    def _announce(self, phase: str, per_epoch: int, epochs: int, how: str) -> None:
        """Print steps per epoch before a phase starts (also stored in the summary)."""
        if self.info.is_main and self.state.step == 0:
            print(f"{self.entry.name}: {phase}, {per_epoch} optimizer steps per epoch x {epochs} epochs ({how})")

    # ------------------------------------------------------------------------------------ phase 1
    def _pretrain(self, ckpt: dict[str, Any] | None) -> None:
        sampler = TextPairSampler(self.inputs.magic, self.entry.pretrain, self.t.pretrain_batch_size,
                                  self.run.train_seed)
        if sampler.batch_size % self.info.world_size:
            raise ValueError(f"train.pretrain_batch_size ({sampler.batch_size}) must be divisible by the number "
                             f"of processes ({self.info.world_size})")
        self.pretrain_info = sampler.describe()
        total = self.t.pretrain_epochs * len(sampler)
        if total:
            projected = text_phase_trainable(self.bundle, self.t.text_trains, sampler.all_texts(),
                                             self.info.world_size)
            if projected is not None:
                self.pretrain_info["tower_outputs_precomputed"] = len(projected)
            self.bundle.model.train()
            module = wrap(Towers(self.bundle.model), self.info)
            stepper = self._stepper(module, self.t.pretrain_lr, total, "pretrain", ckpt)
            self._announce(f"text pretraining (text {self.t.text_trains})", len(sampler), self.t.pretrain_epochs,
                           "distinct targets")
            self._pretrain_epochs(sampler, module, stepper, total, projected)
        s = self.state
        s.pretrain_steps, s.phase, s.epoch, s.batch, s.step = s.step, "train", 0, 0, 0
        self._mark(None)
        self._save_boundary()

    def _pretrain_epochs(self, sampler: TextPairSampler, module: torch.nn.Module, stepper: Stepper,
                         total: int, projected: ProjectedTexts | None) -> None:
        per = sampler.batch_size // self.info.world_size
        part = slice(self.info.rank * per, (self.info.rank + 1) * per)
        align = TextAlignment(self.spec["run"])

        def loss_fn(pair: tuple[list[str], list[str]]) -> dict[str, torch.Tensor]:
            captions, targets = pair
            if projected is not None:
                text = projected(captions[part] + targets[part])
            else:
                _, text = module(None, self.bundle.tokenizer(captions[part] + targets[part]).to(self.device))
            return align(text[:per], text[per:])

        def advance(result: dict[str, float]) -> None:
            s = self.state
            s.batch += 1
            s.count(result)
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

    # ------------------------------------------------------------------------------------ loss: re
    def _re(self, ckpt: dict[str, Any] | None) -> None:
        """The HierarCaps RE alignment (re_run.py): the text tower alone, on train.re_data's items."""
        from cglib.train.re_run import LOSS_PARTS, REBatchSampler, re_items

        t = self.t
        items, described = re_items(self.params, self.inputs.magic)
        sampler = REBatchSampler(items, t.re_batch_size, self.run.train_seed)
        per_epoch = len(sampler)
        self.re_info = {**described, **sampler.describe(), "epochs": t.re_epochs, "lr": t.re_lr,
                        "weights": {"mean": t.re_w_mean, "minimax": t.re_w_minimax, "reg": t.re_w_reg},
                        "regularizer": "embeddings of the starting text tower (eval mode), computed once"}
        self.sampler_info = {**self.re_info, "optimizer_steps_per_epoch": per_epoch}
        total = t.re_epochs * per_epoch
        # the frozen original tower: every text embedded once by the starting weights (a resumed run rebuilds them)
        texts = sampler.all_texts()
        original = self.bundle
        if ckpt is not None:
            original = self.files.fresh_model()
            original.model.to(self.device)
        frozen = torch.from_numpy(encode_texts(original, texts)).to(self.device)
        self.objective.reference(frozen, {text: k for k, text in enumerate(texts)})
        self.n_precomputed = len(texts)
        projected = text_phase_trainable(self.bundle, t.text_trains, [*texts, ""], self.info.world_size)
        # eval mode: no dropout, as in HierarCaps' CLIP (whose towers have none); with a dropout tower (MiniLM:
        # 0.1) train mode would make the regularizer compare noisy embeddings with clean ones (reg > 0 at step 1)
        self.bundle.model.eval()
        module = wrap(Towers(self.bundle.model), self.info)
        stepper = self._stepper(module, t.re_lr, total, "re", ckpt)
        self._announce(f"RE alignment (text {t.text_trains})", per_epoch, t.re_epochs,
                       f"train.re_data: {t.re_data}, {len(items)} items, batch {sampler.batch_size}")

        def embed(texts: list[str]) -> torch.Tensor:
            if projected is not None:
                return projected(texts)
            return module(None, tokenize(self.bundle, texts).to(self.device))[1]

        def loss_fn(batch: list) -> dict[str, torch.Tensor]:
            return self.objective(embed, batch)

        def advance(result: dict[str, float]) -> None:
            s = self.state
            s.batch += 1
            s.count(result)
            if s.batch == per_epoch:
                s.epoch_losses.append(s.epoch_sum / max(1, s.epoch_count))
                s.epoch, s.batch, s.epoch_sum, s.epoch_count = s.epoch + 1, 0, 0.0, 0
            self._mark(stepper)

        bar = self._bar(total, "RE")
        while self.state.epoch < t.re_epochs:
            epoch = self.state.epoch
            tick = time.perf_counter()
            batch = sampler.batch(epoch, self.state.batch)
            wait = time.perf_counter() - tick
            result = stepper.step([batch], loss_fn, advance)
            self._record(epoch, result, 0, wait, time.perf_counter() - tick,
                         {f"re_{k}": result[k] for k in LOSS_PARTS})
            bar.update(1)
            if self.state.batch == 0:  # an epoch ended
                self._save_boundary()
                self.files.save_epoch_weights(self.bundle, self.state.epoch)
        bar.close()

    # ------------------------------------------------------------------------------------ phase 2
    def _advance(self, stepper: Stepper, items: list[dict[str, Any]], images: int, wait: float, tick: float,
                 result: dict[str, float]) -> None:
        """Count a completed image-text optimizer step (called inside the update's interrupt-proof section)."""
        s = self.state
        s.batch += len(items)
        s.count(result)
        s.images += images
        s.data_wait_s += wait
        s.compute_s += time.perf_counter() - tick - wait
        s.fallback_batches += sum(1 for item in items if item["fallback_groups"])
        s.repeated_images += sum(item["repeated_images"] for item in items)
        self.objective.after_step(bool(result.get("skipped")))
        self._mark(stepper)

    def _text_table(self, sampler: GroupBatchSampler, extra: set[str] | None = None
                    ) -> tuple[dict[str, int] | None, torch.Tensor | None]:
        """A frozen text tower's embeddings of every text a batch can hold (`extra`: an objective's replacement
        texts, e.g. clip_hn's permuted captions)."""
        if not self.params.model.freeze_text:
            return None, None
        texts = sorted(set(sampler.all_texts()) | extra) if extra else sampler.all_texts()
        table = torch.from_numpy(encode_texts(self.bundle, texts)).to(self.device)
        return {t: k for k, t in enumerate(texts)}, table

    def _start_model(self) -> ClipModel:
        """The run's STARTING model: the current one before any step, else rebuilt without touching the RNG."""
        if self.state.global_step == 0:
            return self.bundle
        with torch.random.fork_rng(devices=[]):  # building a model draws init weights: keep the run's RNG stream
            return self.files.fresh_model()

    def _train(self, ckpt: dict[str, Any] | None) -> None:
        t, info = self.t, self.info
        sampler = GroupBatchSampler(self.inputs.magic, t.groups_per_batch, t.pairs_per_group,
                                    self.run.train_seed, text_source(self.params, self.entry), set(self.inputs.cache.image_ids),
                                    epoch=t.epoch)
        if t.groups_per_batch % info.world_size:
            raise ValueError(f"train.groups_per_batch ({t.groups_per_batch}) must be divisible by the number of "
                             f"processes ({info.world_size}) so every rank holds whole groups")
        self.objective.check(self.params, self.entry)
        per_epoch = math.ceil(len(sampler) / t.grad_accum)
        self.sampler_info = {**sampler.describe(), "optimizer_steps_per_epoch": per_epoch,
                             "group_source": self.entry.groups}
        if self.inputs.groups == "ngram":
            self.sampler_info["ngram"] = {k: v for k, v in self.inputs.magic.stats.get("ngram", {}).items()
                                          if k not in ("too_frequent", "aliases", "removed_from_l1")}
        total = t.epochs * per_epoch
        resumed = None if ckpt is None or ckpt["stepper"] is None else ckpt.get("objective")
        self.objective.setup(Setup(self.bundle, self._start_model, sampler, self.inputs, self.params, self.entry,
                                   self.run.train_seed, t.epochs, self.device, resumed, self.state.step))
        set_trainable(self.bundle, image=True, text=not self.params.model.freeze_text)
        self.bundle.model.train()
        text_rows, table = self._text_table(sampler, self.objective.replacement_texts())
        self.n_precomputed = 0 if table is None else len(table)
        module = wrap(GroupTask(self.bundle, self.objective, table), info)
        stepper = self._stepper(module, t.lr, total, "train", ckpt, self.objective)
        self._announce("image-text", per_epoch, t.epochs, f"train.epoch: {t.epoch}, "
                       f"{sampler.describe()['training_pairs']} training pairs{self.objective.announce()}")

        bar = self._bar(total, "image-text")
        while self.state.epoch < t.epochs:
            data = GroupBatchData(sampler, self.inputs.cache, self.state.epoch, self.state.batch, info, text_rows,
                                  self.bundle.tokenizer, self.objective.pair_replacements())
            batches = batch_loader(data, t.num_workers, self.device)
            while self.state.batch < len(sampler):
                tick = time.perf_counter()
                items = [next(batches) for _ in range(min(t.grad_accum, len(sampler) - self.state.batch))]
                wait = time.perf_counter() - tick
                images = sum(item["global_images"] for item in items)
                extra = {"fallback_groups": sum(item["fallback_groups"] for item in items),
                         "repeated_images": sum(item["repeated_images"] for item in items)}
                advance = functools.partial(self._advance, stepper, items, images, wait, tick)
                result = stepper.step(items, module, advance)
                self._record(self.state.epoch, result, images, wait, time.perf_counter() - tick, extra)
                bar.update(1)
                if self.state.step % t.log_every == 0:
                    bar.set_postfix(loss=f"{result['loss']:.4f}", lr=f"{result['lr']:.2e}")
            with defer_interrupts():
                s = self.state
                s.epoch_losses.append(s.epoch_sum / max(1, s.epoch_count))
                s.epoch, s.batch, s.epoch_sum, s.epoch_count = s.epoch + 1, 0, 0.0, 0
                self._mark(stepper)
            self._save_boundary()
            self.files.save_epoch_weights(self.bundle, s.epoch)
            if self.on_epoch is not None:
                self.on_epoch(s.epoch, self.bundle)
        bar.close()
        if info.is_main:  # training-only weights (mcc's head): kept for inspection, never part of the model
            from safetensors.torch import save_file

            for file, tensors in self.objective.training_only_weights().items():
                save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(self.out / file))
