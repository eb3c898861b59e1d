"""One train.runs entry from start (or its checkpoint) to final weights and summary, through one loop.

A run is a sequence of phases (phases.py): optional textual pretraining, then the image-text epochs over group
batches with the run's objective; or, for a text objective (re), its RE phase alone. `run_phase` is the only
training loop: it steps, counts (`Progress`), logs, marks the position after every optimizer step and calls the
callbacks after every epoch (callbacks.py: checkpoints, the search's pruning). The checkpoint of the last
completed optimizer step is written at each epoch end and on an interruption (faults.py).
"""

from __future__ import annotations

import copy
import functools
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from cglib.config import TrainRunParams
from cglib.distributed import DistInfo
from cglib.frontend import tqdm  # tqdm.auto live, a text bar left at its final count headless
from cglib.models import ClipModel
from cglib.run import RunContext, seed_everything
from cglib.train import phases
from cglib.train.callbacks import Callback, Checkpoints, EpochHook
from cglib.train.checkpoint import Progress, RunFiles
from cglib.train.faults import checkpoint_on_signals, defer_interrupts, resolved_precision
from cglib.train.inputs import TrainInputs, distributed_refusal, run_spec
from cglib.train.objectives import Objective, build_objective
from cglib.train.optim import amp_dtype
from cglib.train.phases import Phase
from cglib.train.released import TRAINED_HERE, load_released, released_present
from cglib.train.runlog import LOG_COLUMNS, RunLog, logged_steps
from cglib.train.step import Stepper
from cglib.train.summary import finish

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
        first = self.objective.phase if self.objective.phase != "train" else \
            "pretrain" if entry.pretrain != "none" else "train"
        self.state = Progress(phase=first)
        # (progress, rng, stepper) at the last completed optimizer step: weights and optimizer only change inside
        # Stepper's interrupt-proof update, so together with them this is an exact checkpoint at any interruption
        self.boundary: tuple[dict[str, Any], dict[str, Any], Stepper | None] | None = None
        self.resumed_from: int | None = None
        # this attempt's account (summary.json `account`): optimizer steps and epochs counted as they are done,
        # beside what the checkpoint kept and what an earlier attempt did past its checkpoint (done again here)
        self.done_now = {"steps": 0, "epochs": 0}
        self.kept = {"steps": 0, "epochs": 0}
        self.repeated_steps = 0
        self.warmup_used: dict[str, int] = {}
        # what the phases tell the run summary (sampler, pretraining, re_training, precomputed_texts)
        self.described: dict[str, Any] = {}
        # after every epoch: the checkpoint, then the caller's on_epoch (the search scores and may prune there)
        self.callbacks: list[Callback] = [Checkpoints(), *([EpochHook(on_epoch)] if on_epoch else [])]
        self.weights_source: dict[str, Any] = {"kind": TRAINED_HERE}
        if inputs.groups != entry.groups:
            raise ValueError(f"run {entry.name!r} trains on groups: {entry.groups}, but these inputs hold "
                             f"{inputs.groups} groups; load them with load_inputs(run, groups={entry.groups!r}) "
                             "(train_one and train_all do)")

    def _mark(self, stepper: Stepper | None) -> None:
        """Remember the position after a completed optimizer step (cheap: counters and RNG, no weights)."""
        self.state.wall_s = self.clock()
        self.boundary = (copy.deepcopy(self.state.state()), self.files.rng(), stepper)

    def save_boundary(self) -> None:
        if self.boundary is not None:
            self.files.save_checkpoint(self.bundle, *self.boundary, objective=self.objective)

    # ------------------------------------------------------------------------------------ main
    def __call__(self) -> dict[str, Any]:
        """Train (or resume) the run; return its summary (written by summary.finish)."""
        # checked here, not when the trainer is built: a finished run is read (as another run's init) under torchrun
        refusal = distributed_refusal(self.params, self.entry) if self.info.distributed else None
        if refusal:
            raise ValueError(f"run {self.entry.name!r} cannot run under torchrun ({refusal}); run it without "
                             "torchrun (train.processes: 1 trains it in one process)")
        seed_everything(self.run.train_seed)  # the training seed: init of anything built here
        ckpt = self.files.load_checkpoint()
        if self.info.is_main and not (self.out / "summary.json").is_file():
            # an unfinished earlier attempt: the steps it logged past its checkpoint (all, without one) are lost
            self.repeated_steps = logged_steps(self.out / "log.csv",
                                               after=ckpt["progress"]["global_step"] if ckpt else 0)
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
            self.kept = {"steps": self.state.global_step,
                         "epochs": len(self.state.epoch_losses) + len(self.state.pretrain_losses)}
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
                    self.run_phase(phases.re_alignment(self, ckpt))
                else:
                    if self.state.phase == "pretrain":
                        pretraining = phases.textual_pretraining(self, ckpt)
                        if pretraining is not None:
                            self.run_phase(pretraining)
                        self._end_pretraining()
                        ckpt = None
                    self.run_phase(phases.image_text(self, ckpt))
                    self._save_training_only_weights()
        except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM (faults.Terminated)
            self.save_boundary()
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
        warmup = self.t.warmup_steps
        if phase in ("pretrain", "re"):  # the text phases are short: their warmup is at most a tenth of them
            warmup = min(warmup, total // 10)
        elif warmup >= total:
            warmup = total // 10
            warnings.warn(f"train.warmup_steps ({self.t.warmup_steps}) >= the run's {total} optimizer steps; "
                          f"warming up over {warmup} steps instead", stacklevel=2)
        self.warmup_used[phase] = warmup
        return warmup

    def make_stepper(self, module: torch.nn.Module, lr: float, total: int, phase: str,
                     ckpt: dict[str, Any] | None, head: torch.nn.Module | None = None) -> Stepper:
        """The phase's optimizer over the model (and `head`, an objective with trainable weights), restored from
        the checkpoint when it was saved inside this phase."""
        stepper = Stepper(self.bundle.model, module, lr=lr, weight_decay=self.t.weight_decay,
                          warmup_steps=self._warmup(total, phase), total_steps=total, amp=self.amp,
                          grad_clip=self.t.grad_clip, device=self.device, head=head, betas=self.t.adam_betas,
                          eps=self.t.adam_eps)
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
               "empty": int(result.get("empty", 0)),
               "images_per_s": images / max(step_s, 1e-9) if images else float("nan"),
               "data_wait_s": wait, "step_s": step_s, "wall_s": round(self.clock(), 3), **extra}
        self.log.row({k: row.get(k, "") for k in LOG_COLUMNS})
        if self.on_step is not None:
            self.on_step(row)

    def announce(self, phase: str, per_epoch: int, epochs: int, how: str) -> None:
        """Print steps per epoch before a phase starts (also stored in the summary)."""
        if self.info.is_main and self.state.step == 0:
            print(f"{self.entry.name}: {phase}, {per_epoch} optimizer steps per epoch x {epochs} epochs ({how})")

    def start_model(self) -> ClipModel:
        """The run's STARTING model: the current one before any step, else rebuilt without touching the RNG."""
        if self.state.global_step == 0:
            return self.bundle
        with torch.random.fork_rng(devices=[]):  # building a model draws init weights: keep the run's RNG stream
            return self.files.fresh_model()

    # ------------------------------------------------------------------------------------ the one loop
    def run_phase(self, phase: Phase) -> None:
        """Every optimizer step of a phase from the current position: `phase.micro_batches` micro-batches a step,
        counted and checkpointed at its end, then each epoch's mean loss and the callbacks."""
        s = self.state
        bar = self._bar(phase.epochs * phase.steps_per_epoch, phase.title)
        while s.epoch < phase.epochs:
            batches = phase.batches(s.epoch, s.batch)
            while s.batch < phase.batches_per_epoch:
                tick = time.perf_counter()
                items = [next(batches) for _ in range(min(phase.micro_batches, phase.batches_per_epoch - s.batch))]
                wait = time.perf_counter() - tick
                images = sum(item["global_images"] for item in items) if phase.image_text else 0
                advance = functools.partial(self._advance, phase, items, images, wait, tick)
                trained = [item for item in items if not phase.empty(item)]
                result = phase.stepper.step(trained, phase.loss, advance)
                self._record(s.epoch, result, images, wait, time.perf_counter() - tick, phase.log(items, result))
                bar.update(1)
                if s.step % self.t.log_every == 0:
                    bar.set_postfix(loss=f"{result['loss']:.4f}", lr=f"{result['lr']:.2e}")
            with defer_interrupts():
                getattr(s, phase.losses).append(s.epoch_sum / max(1, s.epoch_count))
                s.epoch, s.batch, s.epoch_sum, s.epoch_count = s.epoch + 1, 0, 0.0, 0
                self.done_now["epochs"] += 1
                self._mark(phase.stepper)
            for callback in self.callbacks:
                callback.epoch_end(self, phase)
        bar.close()

    def _advance(self, phase: Phase, items: list[Any], images: int, wait: float, tick: float,
                 result: dict[str, float]) -> None:
        """Count a completed optimizer step (called inside the update's interrupt-proof section)."""
        s = self.state
        s.batch += len(items)
        s.count(result)
        self.done_now["steps"] += 1
        if phase.image_text:
            s.images += images
            s.data_wait_s += wait
            s.compute_s += time.perf_counter() - tick - wait
            s.fallback_batches += sum(1 for item in items if item["fallback_groups"])
            s.repeated_images += sum(item["repeated_images"] for item in items)
        phase.objective.after_step(bool(result.get("skipped")))  # e.g. commit (or discard) a memory's update
        self._mark(phase.stepper)

    def _save_training_only_weights(self) -> None:
        """Trained tensors outside the model (mcc's head): kept for inspection, never part of the evaluated model."""
        if self.info.is_main:
            from safetensors.torch import save_file

            for file, tensors in self.objective.training_only_weights().items():
                save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(self.out / file))

    def _end_pretraining(self) -> None:
        """Between the text and the image-text phase: a checkpoint with no optimizer (the next starts fresh)."""
        s = self.state
        s.pretrain_steps, s.phase, s.epoch, s.batch, s.step = s.step, "train", 0, 0, 0
        self._mark(None)
        self.save_boundary()
