"""One train.runs entry from start (or its checkpoint) to final weights and summary, through one loop.

A run is a sequence of phases (phases.py): optional textual pretraining, then the image-text epochs over group
batches with the run's objective; or, for a text objective (re), its RE phase alone. `run_phase` is the only
training loop: it steps, counts, logs and marks the position after every optimizer step, and calls the callbacks
at every event (callbacks.py: train, epoch and step begin/end, evaluate), then does what they asked of `control`:
write the checkpoint (`Checkpoints` asks at every epoch end), stop. The checkpoint of the last completed optimizer
step is also written on an interruption (faults.py).

The Trainer is the only owner of the run's state: it builds the run's fixed `RunSetup` (setup.py) and its changing
`TrainState` (state.py) and hands them to the phases and the run summary; callbacks see the state read-only.
"""

from __future__ import annotations

import copy
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cglib.config import TrainRunParams
from cglib.distributed import DistInfo
from cglib.frontend import tqdm  # tqdm.auto live, a text bar left at its final count headless
from cglib.models import ClipModel
from cglib.run import RunContext, seed_everything
from cglib.train import phases
from cglib.train.callbacks import Callback, Checkpoints, StateView, TrainControl, load_callback
from cglib.train.checkpoint import RunFiles
from cglib.train.faults import checkpoint_on_signals, defer_interrupts, resolved_precision
from cglib.train.inputs import TrainInputs, distributed_refusal, run_spec
from cglib.train.objectives import build_objective
from cglib.train.optim import amp_dtype
from cglib.train.phases import Phase
from cglib.train.released import TRAINED_HERE, load_released, released_present
from cglib.train.runlog import LOG_COLUMNS, RunLog, logged_steps
from cglib.train.setup import RunSetup
from cglib.train.state import Progress, TrainState
from cglib.train.step import Stepper
from cglib.train.summary import finish

logger = logging.getLogger(__name__)


class Trainer:
    """One train.runs entry from start (or its checkpoint) to final weights and summary."""

    def __init__(self, run: RunContext, entry: TrainRunParams, inputs: TrainInputs, info: DistInfo,
                 on_step: Callable[[dict[str, Any]], None] | None, progress: bool,
                 callbacks: Sequence[Callback] = (),
                 evaluate: Callable[[ClipModel], Mapping[str, Any]] | None = None) -> None:
        """`on_step(row)` gets every optimizer step's log.csv row (it may raise KeyboardInterrupt: the run then
        checkpoints as on Ctrl-C). `callbacks` run after the built-in `Checkpoints` and those train.callbacks
        names. `evaluate(model)` scores the model after each image-text epoch; its metrics go to the callbacks'
        `on_evaluate` (the hyper-parameter search scores the validation split there and prunes)."""
        spec = run_spec(run.params, entry, run.training_seed)
        amp = amp_dtype(run.params.train.amp, info.device)
        files = RunFiles(run, entry.name, {**spec, "data": inputs.fingerprint}, info,
                         resolved_precision(info.device, amp))
        # the objective's run-long state (a head, a memory) lives in it; the loop only calls its hooks
        objective = build_objective(run.params, entry, spec["run"]).to(info.device)
        self.setup = RunSetup(run, entry, inputs, info, spec, files, objective, amp, progress)
        first = objective.phase if objective.phase != "train" else \
            "pretrain" if entry.pretrain != "none" else "train"
        self.state = TrainState(Progress(phase=first), run=entry.name, is_main=info.is_main,
                                weights_source={"kind": TRAINED_HERE})
        self.on_step, self.evaluate = on_step, evaluate
        # the checkpoint first (at every epoch end), then those params name, then the caller's
        named = [load_callback(path)() for path in run.params.train.callbacks]
        self.callbacks: list[Callback] = [Checkpoints(), *named, *callbacks]
        self.control = TrainControl()
        self.view = StateView(self.state)
        # (progress, rng, stepper) at the last completed optimizer step: weights and optimizer only change inside
        # Stepper's interrupt-proof update, so together with them this is an exact checkpoint at any interruption
        self.boundary: tuple[dict[str, Any], dict[str, Any], Stepper | None] | None = None
        if inputs.groups != entry.groups:
            raise ValueError(f"run {entry.name!r} trains on groups: {entry.groups}, but these inputs hold "
                             f"{inputs.groups} groups; prepare them with cglib.prepare.prepare_inputs(run, "
                             f"names=[{entry.name!r}]) and pass train_one or train_all what it prepared")

    @property
    def out(self) -> Path:
        """The run's folder (training/<name>/)."""
        return self.setup.files.out

    @property
    def hash(self) -> str:
        """The run's spec hash (summary.json `spec_hash`)."""
        return self.setup.files.hash

    def _mark(self, stepper: Stepper | None) -> None:
        """Remember the position after a completed optimizer step (cheap: counters and RNG, no weights)."""
        self.state.progress.wall_s = self.state.elapsed_s()
        self.boundary = (copy.deepcopy(self.state.progress.state()), self.setup.files.rng(), stepper)

    def save_boundary(self) -> None:
        if self.boundary is not None:
            self.setup.files.save_checkpoint(self.bundle, *self.boundary, objective=self.setup.objective)

    # ------------------------------------------------------------------------------------ callbacks
    def _event(self, name: str, *args: Any) -> None:
        for callback in self.callbacks:
            stopping = self.control.should_training_stop
            getattr(callback, name)(self.view, self.control, *args)
            if not callback.changes_result and self.control.should_training_stop and not stopping:
                raise ValueError(f"callback {type(callback).__qualname__} asked to stop training but declares "
                                 "changes_result = False (it only observes, so it is not part of the run's spec); "
                                 "remove changes_result = False so that its code enters the run's spec")

    def _act(self, epoch_weights: bool = False) -> bool:
        """Do what the callbacks asked after an event: write the checkpoint (and, at an epoch end of a phase that
        keeps them, the epoch's weights); True when they asked to stop (recorded where, for the summary)."""
        c, s = self.control, self.state.progress
        if c.should_save:
            c.should_save = False
            self.save_boundary()
            if epoch_weights:
                self.setup.files.save_epoch_weights(self.bundle, s.epoch)
        if c.should_training_stop and self.state.stopped is None:
            self.state.stopped = {"reason": c.stop_reason, "phase": s.phase, "epoch": s.epoch,
                                  "global_step": s.global_step}
            logger.info("run %s stopped by a callback after step %d: %s", self.state.run, s.global_step,
                        c.stop_reason)
        return c.should_training_stop

    # ------------------------------------------------------------------------------------ main
    def __call__(self) -> dict[str, Any]:
        """Train (or resume) the run; return its summary (written by summary.finish)."""
        setup, state, files = self.setup, self.state, self.setup.files
        entry, info = setup.entry, setup.info
        # checked here, not when the trainer is built: a finished run is read (as another run's init) under torchrun
        refusal = distributed_refusal(setup.params, entry) if info.distributed else None
        if refusal:
            raise ValueError(f"run {entry.name!r} cannot run under torchrun ({refusal}); run it without "
                             "torchrun (train.processes: 1 trains it in one process)")
        seed_everything(setup.run.train_seed)  # the training seed: init of anything built here
        ckpt = files.load_checkpoint()
        if info.is_main and not (files.out / "summary.json").is_file():
            # an unfinished earlier attempt: the steps it logged past its checkpoint (all, without one) are lost
            state.repeated_steps = logged_steps(files.out / "log.csv",
                                                after=ckpt["progress"]["global_step"] if ckpt else 0)
        if ckpt is None:
            files.clear_outputs()
        files.out.mkdir(parents=True, exist_ok=True)
        self.bundle: ClipModel = files.fresh_model()
        initial = {k: v.detach().clone() for k, v in self.bundle.model.state_dict().items()}
        if ckpt is not None:
            # the checkpoint holds every key but a frozen tower's, which the initial weights already hold
            missing, unexpected = self.bundle.model.load_state_dict(ckpt["model"], strict=False)
            missing = sorted(set(missing) - set(files.frozen))
            if missing or unexpected:
                raise ValueError(f"{files.ckpt_dir / 'last.pt'} does not fit the model: missing {missing[:5]}, "
                                 f"unexpected {unexpected[:5]}; delete it (or set train.resume: false) to start over")
            state.progress = Progress(**ckpt["progress"])
            state.resumed_from = state.progress.global_step
            state.kept = {"steps": state.progress.global_step, "epochs": state.epochs_done()}
            logger.info("resuming %s at %s epoch %d batch %d", entry.name, state.progress.phase,
                        state.progress.epoch, state.progress.batch)
        self.bundle.model.to(setup.device)
        self.log = RunLog(files.out, info.is_main, state.resumed_from, setup.t.log_every)
        state.started = time.perf_counter() - state.progress.wall_s
        try:
            with checkpoint_on_signals():
                self._event("on_train_begin")
                if not self._act():
                    self._train(ckpt)
                self._event("on_train_end")
                self._act()
        except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM (faults.Terminated)
            self.save_boundary()
            if self.boundary is not None:
                logger.warning("%s: run %s saved after step %d; run again to resume",
                               type(stop).__name__ if str(stop) else "interrupted", entry.name,
                               self.boundary[0]["global_step"])
            raise
        finally:
            self.log.close()
        return finish(setup, state, self.bundle, initial)

    def _train(self, ckpt: dict[str, Any] | None) -> None:
        """The run's phases from the current position, until the last ends or a callback stops the run."""
        setup, state = self.setup, self.state
        if state.progress.phase == "re" and released_present(setup.entry):
            state.weights_source = load_released(self.bundle, setup.entry)
        elif state.progress.phase == "re":
            self.run_phase(phases.re_alignment(setup, state, self.bundle, ckpt))
        else:
            if state.progress.phase == "pretrain":
                pretraining = phases.textual_pretraining(setup, state, self.bundle, ckpt)
                if pretraining is not None:
                    self.run_phase(pretraining)
                if state.stopped is not None:
                    return
                self._end_pretraining()
                ckpt = None
            self.run_phase(phases.image_text(setup, state, self.bundle, ckpt))
            self._save_training_only_weights()

    def _bar(self, total: int, phase: str):
        return tqdm(total=total, initial=self.state.progress.step, desc=f"{self.setup.entry.name} {phase}",
                    disable=not (self.setup.progress_bars and self.setup.info.is_main), leave=True)

    def _record(self, epoch: int, result: dict[str, float], images: int, wait: float, step_s: float,
                extra: dict[str, Any]) -> None:
        s = self.state.progress
        row = {"phase": s.phase, "epoch": epoch, "step": s.step,
               "global_step": s.global_step, "loss": result["loss"],
               "inner": result.get("inner", float("nan")), "outer": result.get("outer", float("nan")),
               "lr": result["lr"], "grad_norm": result["grad_norm"], "skipped": int(result.get("skipped", 0)),
               "empty": int(result.get("empty", 0)),
               "images_per_s": images / max(step_s, 1e-9) if images else float("nan"),
               "data_wait_s": wait, "step_s": step_s, "wall_s": round(self.state.elapsed_s(), 3), **extra}
        self.log.row({k: row.get(k, "") for k in LOG_COLUMNS})
        self.state.last_step = row
        if self.on_step is not None:
            self.on_step(row)

    # ------------------------------------------------------------------------------------ the one loop
    def run_phase(self, phase: Phase) -> None:
        """Every optimizer step of a phase from the current position: `phase.micro_batches` micro-batches a step,
        counted at its end, then each epoch's mean loss; the callbacks at every event, until a callback stops."""
        bar = self._bar(phase.epochs * phase.steps_per_epoch, phase.title)
        self._epochs(phase, bar)
        bar.close()

    def _epochs(self, phase: Phase, bar: Any) -> None:
        s = self.state.progress
        while s.epoch < phase.epochs:
            self._event("on_epoch_begin")
            if self._act():
                return
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
                if s.step % self.setup.t.log_every == 0:
                    bar.set_postfix(loss=f"{result['loss']:.4f}", lr=f"{result['lr']:.2e}")
                self._event("on_step_end")
                if self._act():
                    return
            with defer_interrupts():
                getattr(s, phase.losses).append(s.epoch_sum / max(1, s.epoch_count))
                s.epoch, s.batch, s.epoch_sum, s.epoch_count = s.epoch + 1, 0, 0.0, 0
                self.state.trained_now["epochs"] += 1
                self._mark(phase.stepper)
            self._event("on_epoch_end")
            stop = self._act(epoch_weights=phase.keep_epoch_weights)
            if self.evaluate is not None and phase.image_text:
                self._event("on_evaluate", self.evaluate(self.bundle))
                stop = self._act(epoch_weights=phase.keep_epoch_weights)
            if stop:
                return

    def _advance(self, phase: Phase, items: list[Any], images: int, wait: float, tick: float,
                 result: dict[str, float]) -> None:
        """Count a completed optimizer step (called inside the update's interrupt-proof section)."""
        s = self.state.progress
        s.batch += len(items)
        s.count(result)
        self.state.trained_now["steps"] += 1
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
        if self.setup.info.is_main:
            from safetensors.torch import save_file

            for file, tensors in self.setup.objective.training_only_weights().items():
                save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                          str(self.setup.files.out / file))

    def _end_pretraining(self) -> None:
        """Between the text and the image-text phase: a checkpoint with no optimizer (the next starts fresh)."""
        s = self.state.progress
        s.pretrain_steps, s.phase, s.epoch, s.batch, s.step = s.step, "train", 0, 0, 0
        self._mark(None)
        self.save_boundary()
