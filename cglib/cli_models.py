"""`cglib` commands that train or score models on a run: `evaluate-model` (one more model on a finished run's
items) and `search` (the hyper-parameter search). Their heavy imports stay inside the handlers."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import yaml
from pydantic import ValidationError

from cglib.config import ZooModelParams, _format_error, load_params


def parse_model_spec(spec: str, run_model):
    """`--model SPEC`: a YAML/JSON mapping like an eval.zoo entry's `model` ('{name: ViT-B-32, pretrained: openai}')
    or a checkpoint path (loaded into the run's own architecture). ValueError with the fix otherwise."""
    from cglib.models import architecture_params  # lazy: torch; keeps cglib --help light

    try:
        raw = yaml.safe_load(spec)
    except yaml.YAMLError:
        raw = spec
    if isinstance(raw, dict):
        try:
            return ZooModelParams.model_validate({"name": "model", "model": raw}).model
        except ValidationError as exc:
            lines = [_format_error(e) for e in exc.errors()]
            raise ValueError("bad --model spec: " + "; ".join(lines)) from None
    path = Path(str(spec))
    if isinstance(raw, str) and (path.suffix in (".safetensors", ".pt", ".pth", ".bin") or path.is_file()):
        return architecture_params(run_model).model_copy(update={"checkpoint": path.resolve()})
    raise ValueError(f"bad --model spec {spec!r}: pass a mapping like '{{name: ViT-B-32, pretrained: openai}}' "
                     "(the keys of the model section) or the path of a checkpoint (.safetensors, .pt) of the run's "
                     "architecture")


def evaluate_model_command(args: argparse.Namespace) -> int:
    from cglib.evaluate.loading import ModelLoadError  # lazy: torch; keeps cglib --help light
    from cglib.evaluate.pipeline import evaluate_model  # lazy: torch; keeps cglib --help light
    from cglib.evaluate.report import markdown_table  # lazy: torch; keeps cglib --help light
    from cglib.evaluate.table3 import table3_display  # lazy: torch; keeps cglib --help light
    from cglib.run import (  # lazy: numpy; keeps cglib --help light
        RunContext,
        seed_everything,
        set_threads,
        training_dir,
    )
    from cglib.train.checkpoint import INITIAL  # lazy: torch; keeps cglib --help light

    params = load_params(args.params, check_paths=False)
    run_dir = Path(args.run_dir) if args.run_dir else params.run_dir()
    needed = {"magic/magic.json": "03_magic_dag", "captions/dataset.json": "01_captions"}
    for k in params.train.seeds:  # the zero-shot model of every training seed
        needed[str((training_dir(run_dir, k) / INITIAL).relative_to(run_dir))] = "05_training (the zero-shot model)"
    absent = [f"{rel} (written by {nb})" for rel, nb in needed.items() if not (run_dir / rel).is_file()]
    if absent:
        print(f"error: {run_dir} is not a finished run folder: missing {', '.join(absent)}; pass --run-dir "
              "outputs/<run> of these params, or run the pipeline up to 05 first", file=sys.stderr)
        return 2
    try:
        spec = parse_model_spec(args.model, params.model)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    seed_everything(params.run.seed)
    set_threads(params.run.threads)
    run = RunContext(params=params, dir=run_dir, params_path=Path(args.params))
    try:
        result = evaluate_model(run, spec, args.name, progress=not args.quiet)
    except ModelLoadError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(markdown_table(table3_display(result.table3)))
    print(f"results: {result.directory} (metrics.csv, table3.md, results.json)")
    return 0


def search_command(args: argparse.Namespace) -> int:
    from cglib.run import RunContext, seed_everything, set_threads  # lazy: numpy; keeps cglib --help light
    from cglib.search.storage import StorageError, shown_url, storage_url  # lazy: optuna; keeps --help light
    from cglib.search.study import account_line, run_search  # lazy: torch, optuna; keeps cglib --help light

    params = load_params(args.params, check_paths=not args.no_check_paths)
    run_dir = Path(args.run_dir) if args.run_dir else params.run_dir()
    if not (run_dir / "magic" / "magic.json").is_file():
        print(f"error: {run_dir} has no magic/magic.json: run the pipeline up to 03 first (`cglib run {args.params} "
              "--only 01,02,03`) or pass --run-dir outputs/<run>", file=sys.stderr)
        return 2
    seed_everything(params.run.seed)
    set_threads(params.run.threads)
    print(f"study in {shown_url(storage_url(params, run_dir))}")
    # each trial's start and epochs, the waits and the dead workers' trials, one line each (Optuna logs the ends)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s"))
    search_log = logging.getLogger("cglib.search")
    search_log.addHandler(handler)
    search_log.setLevel(logging.INFO)
    search_log.propagate = False  # printed once, whatever a library did to the root logger
    try:
        result = run_search(RunContext(params=params, dir=run_dir, params_path=Path(args.params)),
                            trials=args.trials, progress=not args.quiet)
    except StorageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    best = result.summary["best"]
    print(f"study '{result.study.study_name}': {account_line(result.summary['account'])}")
    if best is None:
        print("no complete trial yet: no best params file")
        return 1
    print(f"best: trial {best['trial']}, validation accuracy {best['value']:.4f}, {best['params']}")
    print(f"best params file: {result.best_params}; summary: {result.dir / 'search.json'}")
    return 0
