"""Fine-tune a CLIP model on MAGIC group batches with one objective per run (`train.runs`): the public entry.

One run = optional textual pretraining (pretrain.py), then `train.epochs` image-text epochs over group batches
(sampler.py; `train.epoch` says what an epoch covers), each step: encode the batch's images (and texts, unless
the text tower is frozen), the run's loss from `cglib.losses`, AdamW with warmup-cosine, AMP, clipping at
`train.grad_clip`, `train.grad_accum` batches per optimizer step. The package's jobs, one module each:

    inputs.py      run entries and specs (the data they read is prepared before training: cglib.prepare)
    sampler.py     what an epoch is (pairs | groups) and the group batches
    batches.py     batches as tensors for a DataLoader (pixels, text rows or tokens, text ids)
    objectives/    the objectives (one module each), their protocol and registry
    step.py        GroupTask (towers + objective: a batch item -> loss parts) and one optimizer step (AdamW, AMP,
                   clipping, accumulation)
    faults.py      SIGINT/SIGTERM checkpoints, skipped non-finite steps, device/AMP checks on resume
    checkpoint.py  the run's files: weights (frozen towers referenced), last.pt
    runlog.py      log.csv and TensorBoard
    state.py       TrainState: the one record of a run while it trains (position, counters, what phases described)
    setup.py       RunSetup: what a run is set up with and keeps to its end (params, entry, inputs, files, objective)
    phases.py      the phases (textual pretraining, RE, image-text) as the loop sees them, and their optimizers
    callbacks.py   callbacks: train/epoch/step events, a read-only state, a control to stop or save (checkpoints)
    trainer.py     the one training loop over a run's phases; the only owner of its state
    re_run.py      loss: re (the HierarCaps baseline): RE items, batches, the step's loss
    summary.py     summary.json, weights moved, the runs' table

Objectives (`train.runs[i].loss`) live in cglib/train/objectives/, one module each behind one protocol
(base.py): clip (CLIP's InfoNCE over the M*N pairs, the fine-tuned-CLIP baseline), pairwise (Eqs. 1-4), centroid
(Eqs. 5-8), re (the HierarCaps baseline, a text-only phase: re_run.py), the related methods clip_hn,
memory_centroid and mcc, or a user's own class as `package.module:ClassName`. The loop never asks which one runs:
it calls the objective's hooks (setup, forward, after_step, describe), checkpoints its state and lets DDP wrap it
with the towers (step.GroupTask). Every objective receives the batch's text ids: two identical strings are never
each other's negatives.

Groups (`train.runs[i].groups`): magic (the MAGIC l1 nodes) or ngram (caption n-grams shared by enough
MAGIC-train images, magic/ngram.json, built from magic.json by the preparation stage, cglib.prepare; such runs
train on the images' original captions).
A run starts from the initial weights, or with `init: NAME` from the final weights of an earlier run (trained
first if needed), whose exposure to evaluation strings it inherits.

Temperature. Every loss uses the fixed `train.tau` / `train.tau_inner` (paper: 0.1, not learned), for the CLIP
baseline too, so the three objectives differ only in their grouping. `model.logit_scale` is read by no loss:
it is frozen at its initial value (DDP requires a gradient for every trainable parameter) and saved unchanged;
retrieval ranks by cosine, which it does not affect.

Frozen text tower. With `model.freeze_text` the text side is a fixed function, so the embeddings of every text
a batch can hold are computed once per run (eval mode) and looked up per step: a step then runs the image
tower only. Its weights are not copied into the run's files: they are referenced and verified by hash.

Training seeds (`train.seeds`). Every run, and the base, is trained once per training seed k: seed k varies
initialization (`initial.safetensors`: the base, any new head) and batch order (`RunContext.train_seed`), while
run.seed keeps the world, MAGIC, the split and the evaluation items fixed. Seed 0 is run.seed itself and writes
to `<run>/training/` (the layout of one-seed runs); seed k > 0 to `<run>/training/seed<k>/`, the same files.

Outputs under `<run>/training/` (or `training/seed<k>/`; a contract evaluation and visualization rely on):
    initial.safetensors (+ initial.json)  weights before training, same seed for every run ("zero-shot"); a
                                          MiniLM text tower is referenced to its package (hash-verified)
    <name>/final.safetensors              weights after training (a tower frozen for the whole run is
                                          referenced to initial.safetensors; `load_trained` resolves it)
    <name>/log.csv                        one row per optimizer step (LOG_COLUMNS)
    <name>/summary.json                   run spec, loss, pretrain, the roles evaluation reads (objective,
                                          fine_tuned_on_magic, init), exposed_to_eval_strings (+ exposure: why),
                                          re_training (loss: re runs: data, items, settings), steps per epoch,
                                          steps, skipped steps, weights moved, wall time, images/s, provenance
    <name>/checkpoints/last.pt            full state at the last epoch end or interruption (removed when done)
    <name>/checkpoints/epoch-XXX.safetensors  weights after each epoch (only with train.keep_epoch_weights)
    <name>/tensorboard/                   TensorBoard events
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cglib import distributed
from cglib.config import Params
from cglib.distributed import DistInfo
from cglib.models import ClipModel, architecture_params, build_model
from cglib.prepare import BaseCorpus, PreparedInputs, TrainInputs
from cglib.prepare.base import initial_spec
from cglib.run import (
    RunContext,
    other_code,
    provenance,
    retrain_changed,
    seed_everything,
    seed_label,
    training_dir,
    write_json,
)
from cglib.train.base import train_base
from cglib.train.batches import GroupBatchData
from cglib.train.checkpoint import FINAL, INITIAL, text_keys
from cglib.train.failures import clear_failure, record_failure
from cglib.train.inputs import code_digests, model_image_size, run_entry, run_spec, torchrun_refusals
from cglib.train.objectives import build_objective
from cglib.train.runlog import LOG_COLUMNS
from cglib.train.step import GroupTask, Stepper, set_trainable, wrap
from cglib.train.summary import ZERO_SHOT, summary_table, weights_moved_note
from cglib.train.trainer import Trainer
from cglib.weights import load_weights, save_weights

__all__ = [
    "FINAL",
    "INITIAL",
    "LOG_COLUMNS",
    "ZERO_SHOT",
    "GroupBatchData",
    "GroupTask",
    "Stepper",
    "TrainInputs",
    "base_record",
    "build_objective",
    "ensure_initial",
    "load_trained",
    "model_image_size",
    "run_entry",
    "run_spec",
    "seed_label",
    "set_trainable",
    "summary_table",
    "train_all",
    "train_one",
    "weights_moved_note",
    "wrap",
]

logger = logging.getLogger(__name__)


def ensure_initial(run: RunContext, info: DistInfo | None = None, progress: bool = True,
                   base: BaseCorpus | None = None) -> Path:
    """Save the weights every run starts from (the zero-shot row) once per spec: `training/initial.safetensors`.

    Without a base corpus these are the model as built (a pretrained tag, or random init); with
    `train.base.corpus` the model is first trained with the CLIP loss on that corpus (base.py), which
    `prepare_inputs` prepared (`base`, on rank 0), and `initial.json` records what the base saw. A MiniLM text
    tower is the package's own pretrained weights: the file references it (with its hash) instead of copying its
    22M parameters.
    """
    info = info or DistInfo()
    path = run.training_dir / INITIAL
    meta_path = path.with_suffix(".json")
    want = initial_spec(run)
    current = None
    if meta_path.is_file() and path.is_file():
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        current = meta.get("spec")
        if current == want and not _reusable(f"the initial weights of training seed {run.training_seed}",
                                             meta.get("provenance"), info, meta_path):
            current = None
    if current != want and info.is_main:
        if run.params.train.base.corpus != "none" and base is None:
            raise ValueError(f"the initial weights of training seed {run.training_seed} must be trained on the base "
                             f"corpus ({run.params.train.base.corpus}), which was not prepared: call "
                             f"cglib.prepare.prepare_inputs(run, seeds=[{run.training_seed}]) and pass its result")
        seed_everything(run.train_seed)  # the training seed initializes the base (and any new head)
        bundle = build_model(run.params.model, "cpu")
        record: dict[str, Any] = {"spec": want}
        if base is not None and run.params.train.base.corpus != "none":
            record["base"] = {**base.record, **train_base(run.params, bundle, base, run.device(), progress,
                                                          seed=run.train_seed)}
            bundle.model.to("cpu")
        from_package = bundle.text_tower == "minilm" and run.params.model.freeze_text
        save_weights(bundle.model, path, exclude=text_keys(bundle.model) if from_package else (),
                     source="package" if from_package else None)
        write_json(meta_path, {**record, "training_seed": run.training_seed, "model": bundle.info(),
                               "provenance": provenance(run.params)})
    distributed.barrier(info)
    return path


def base_record(run_dir: str | Path, seed: int = 0) -> dict[str, Any] | None:
    """What the base model (the zero-shot row) of training seed `seed` was trained on, from its `initial.json`;
    None without a base."""
    meta = training_dir(run_dir, seed) / INITIAL
    meta = meta.with_suffix(".json")
    if not meta.is_file():
        return None
    return json.loads(meta.read_text(encoding="utf-8")).get("base")


def train_one(run: RunContext, name: str, *, prepared: PreparedInputs, info: DistInfo | None = None,
              on_step: Callable[[dict[str, Any]], None] | None = None, progress: bool = True,
              read_only: bool = False) -> dict[str, Any]:
    """Train the train.runs entry `name` on the inputs `prepared` for it (cglib.prepare.prepare_inputs), resuming
    its checkpoint when allowed; return its summary.

    read_only: return the summary of the run as another process trained it (notebook 05's torchrun child), checked
    against these params like a finished run; never train."""
    entry = run_entry(run.params, name)
    prepared.check_covers([name], [run.training_seed])
    info = info or distributed.current(run.device())
    if read_only:
        done = _finished(Trainer(run, entry, prepared.for_entry(entry), info, None, progress))
        if done is None:
            raise RuntimeError(f"run {name!r} has no final weights for these params under {run.training_dir}; "
                               "the training process did not finish it (see its output above)")
        return done
    ensure_initial(run, info, progress, prepared.base)
    if entry.init is not None:  # its final weights start this run: trained first when not yet (or not reusable)
        start = run_entry(run.params, entry.init)
        done = _finished(Trainer(run, start, prepared.for_entry(start), info, None, progress))
        if done is None or (retrain_changed() and other_code(done.get("provenance")) is not None):
            train_one(run, entry.init, prepared=prepared, info=info, progress=progress)
    trainer = Trainer(run, entry, prepared.for_entry(entry), info, on_step, progress)  # its groups: MAGIC or n-grams
    if info.is_main:
        for digest in code_digests(run.params, entry).values():
            if digest.digest is None:
                print(digest.unreadable_note(name))
    done = _finished(trainer) if run.params.train.resume else None
    if done is not None and _reusable(f"run {name!r}", done.get("provenance"), info, trainer.out):
        logger.info("run %s is already trained with these params; reusing it", name)
        return done
    return trainer()


_ANNOUNCED: set[tuple[str, str, bool]] = set()  # (base's path, other code, retrained) said in this process


def _reusable(what: str, recorded: dict[str, Any] | None, info: DistInfo, where: Path) -> bool:
    """Whether a finished result with this spec may be reused: always when this library code made it (its
    provenance), else unless retraining such results was asked for (`--retrain-changed`); either way a result of
    other code is named on the terminal, so a number never comes from other code unannounced."""
    other = other_code(recorded)
    if other is None:
        return True
    again = retrain_changed()
    # the base is checked before every run of a training: said once per process; a run, on every reuse
    if info.is_main and (where.name != "initial.json" or (str(where), other, again) not in _ANNOUNCED):
        _ANNOUNCED.add((str(where), other, again))
        print(f"{what}: trained by {other}, whose library code differs from this one's: training it again "
              "(--retrain-changed)" if again else f"{what}: reused, trained by {other}, whose library code differs "
              "from this one's (--retrain-changed trains it again with this code)")
    return not again


def _finished(trainer: Trainer) -> dict[str, Any] | None:
    """The summary of the trainer's run when its final weights were written for this spec, else None."""
    summary_path = trainer.out / "summary.json"
    if summary_path.is_file() and (trainer.out / FINAL).is_file():
        done = json.loads(summary_path.read_text(encoding="utf-8"))
        if done.get("spec_hash") == trainer.hash:
            return done
    return None


def train_all(run: RunContext, prepared: PreparedInputs, names: list[str] | None = None, progress: bool = True,
              info: DistInfo | None = None, seeds: list[int] | None = None,
              read_only: bool = False) -> dict[str, dict[str, Any]]:
    """Train every train.runs entry (or those named) under every training seed (train.seeds, or `seeds`) on the
    inputs `prepared` for them (cglib.prepare.prepare_inputs, called just before), each from its seed's initial
    weights or from run `init`'s final weights (trained first when it is not yet); summaries by `seed_label` (the
    name itself for seed 0). read_only: read what another process trained (train_one)."""
    names = names or [r.name for r in run.params.train.runs]
    for name in names:
        run_entry(run.params, name)  # fail before any work on a typo
    info = info or distributed.current(run.device())
    seeds = seeds if seeds is not None else run.params.train.seeds
    prepared.check_covers(names, seeds)
    if info.distributed:  # before any work: a run, or an init it would train first, that cannot run under torchrun
        refused = {n: r for name in names for n, r in torchrun_refusals(run.params, name).items()
                   if n in names or not all((run.for_training_seed(k).training_dir / n / FINAL).is_file()
                                            for k in seeds)}
        if refused:
            raise ValueError("these runs cannot run under torchrun: " + "; ".join(f"{n} ({r})" for n, r in
                             refused.items()) + ". Train them in one process (python -m cglib.train PARAMS --runs "
                             "NAME, or train.processes: 1), or leave them out with --runs")
    out = {}
    for position, k in enumerate(seeds, start=1):
        seeded = run.for_training_seed(k)
        if info.is_main and len(seeds) > 1:  # each seed repeats every run's lines: say whose they are
            print(f"Training seed {k} ({position} of {len(seeds)}), in {seeded.training_dir.relative_to(run.dir)}:")
        ensure_initial(seeded, info, progress, prepared.base)
        for name in names:
            try:
                out[seed_label(name, k)] = train_one(seeded, name, prepared=prepared, info=info, progress=progress,
                                                     read_only=read_only)
            except Exception as exc:  # on record for the run's account (failures.py), then raised as it was
                if info.is_main:
                    record_failure(seeded.training_dir / name, name, k, exc)
                raise
            if info.is_main:
                clear_failure(seeded.training_dir / name)
    return out


def load_trained(params: Params, run_dir: str | Path, name: str, device: str = "cpu", seed: int = 0) -> ClipModel:
    """The model trained by run `name` of train.runs, or "zero-shot" (the initial weights), under training seed
    `seed`, in eval mode."""
    base = training_dir(run_dir, seed)
    if name == ZERO_SHOT:
        path = base / INITIAL
    else:
        run_entry(params, name)
        path = base / name / FINAL
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run notebook 05_training (or `python -m cglib.train`) first")
    bundle = build_model(architecture_params(params.model), device)
    load_weights(bundle.model, path)
    bundle.model.eval()
    return bundle
