"""One protocol key at a time (`cglib ablate PARAMS --rows ...`): what each as-published / corrected difference alone
does to the rows of a finished run.

For each key of `cglib.config.protocol.DIFFERENCES` (by default every key whose flip changes the spec of a named
row), the named rows are trained once more with only that key set to the other protocol's value
(`protocol_value(key, other)`): same params file otherwise, same training seeds, same base, same MAGIC. Each
flipped row is then scored against the run's own row (`cglib.evaluate.ablation`).

Where the flipped runs live. Each key gets a run folder of its own inside the run, `<run>/ablation/<key>/`, made by
`cglib.run.link_run` over the run (its `ablation/`, `figures/` and `search/` left out): every file of the run is a
link there, so the captions, MAGIC, the image cache, the base (`training/initial.*`), the evaluation's embedding
cache and the trained rows cost nothing and are never recomputed. Its `params.yaml` is its own: the run's params
with the key flipped, the named rows (and the rows their `init` names) as train.runs and no zoo. Training then runs
as in notebook 05 (`prepare_inputs`, `train_runs`, on every GPU the params ask for): a row whose spec the flip
leaves unchanged finds the run's finished row through the links and is reused, exactly as a run reuses a finished
row; before that, the folders of the rows the flip changes are emptied of links, so their new weights, logs and
checkpoints are files of the flipped folder and the run's own are never written through. Evaluation is notebook
06's `evaluate_run` in that folder (its result files replace the links; embeddings of unchanged models are read
from the run's cache). A flipped row is a run like every other: its spec hash decides reuse on the next call, and
its provenance records the library code, so other code is named when it is reused and `--retrain-changed` trains
it again; a rerun of `cglib ablate` trains only what is missing.

The base stays the run's. Where the base is trained here (train.base.corpus), its spec reads a few train keys
(weight decay, precision); flipping one of them would retrain the base and change every row's starting point. The
flipped folder's `initial.json` then records the run's base as its own for the flipped spec (`kept_from` names the
run and its spec), so every flipped row starts from the run's base weights, as on the paper profile, where the
base is OpenAI's CLIP whatever the keys say.

The cost: row trainings = keys x rows (with their init chain) x training seeds, minus the rows a key leaves
unchanged (`AblationPlan.trainings`); `--dry-run` prints it from the params alone, before any run exists.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import yaml

from cglib.config import Params, ParamsError, deep_merge, load_params, params_root, parse_params
from cglib.config.protocol import DIFFERENCES, OPTION_PREFIX, PROTOCOLS, protocol_value
from cglib.evaluate import evaluate_run
from cglib.evaluate.ablation import ABLATION_DIR, ablation_cells, ablation_markdown, write_ablation
from cglib.evaluate.results import METRICS_FILE, RESULTS_FILE, SCORES_FILE, load_scores
from cglib.prepare import prepare_inputs
from cglib.prepare.base import initial_spec
from cglib.prepare.stage import with_inits
from cglib.run import (
    RunContext,
    link_run,
    open_run,
    other_code,
    output_path,
    save_params,
    training_dir,
    write_json,
)
from cglib.train.checkpoint import FINAL, INITIAL
from cglib.train.inputs import OPTION_KEY_DEFAULTS, run_entry, run_spec
from cglib.train.processes import train_runs
from cglib.viz.ablation import plot_ablation
from cglib.viz.style import apply_style, save_figure

LINK_SKIP = frozenset({ABLATION_DIR, "figures", "search"})  # what a flipped folder does not link from the run
FIGURE_STEM = "ablation"
SUMMARY = "summary.json"


@dataclass
class Flip:
    """One key flipped: its values, the rows it retrains (`changed`) and those it leaves as the run's (`reused`),
    and the flipped params (the named rows and their init chain as train.runs, no zoo)."""

    key: str
    from_value: Any
    to_value: Any
    pinned: bool  # the params file sets the key itself (its value is not the run protocol's)
    changed: list[str]
    reused: list[str]
    params: Params


@dataclass
class AblationPlan:
    """What `ablate` trains: the run's protocol and the other, the rows, the training seeds, one Flip per key, and
    the keys left out with why."""

    params_path: Path
    params: Params  # the run's params, as validated
    protocol: str
    other: str
    rows: list[str]
    seeds: list[int]
    flips: list[Flip]
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def trainings(self) -> int:
        """Row trainings the ablation needs: the changed rows of every key under every training seed."""
        return sum(len(f.changed) for f in self.flips) * len(self.seeds)

    @property
    def reused(self) -> int:
        """Row trainings saved: rows (with their init chain) a key leaves unchanged, under every training seed."""
        return sum(len(f.reused) for f in self.flips) * len(self.seeds)

    def lines(self) -> list[str]:
        """The plan in words: one line per key, the total."""
        out = [f"{f.key}: {f.from_value!r}{' (the params file sets it)' if f.pinned else ''} -> {f.to_value!r}; "
               f"trains {', '.join(f.changed)}"
               + (f"; reuses {', '.join(f.reused)}" if f.reused else "") for f in self.flips]
        out += [f"not flipped: {key} ({why})" for key, why in self.skipped.items()]
        out.append(f"{self.trainings} row trainings ({len(self.flips)} keys, rows {', '.join(self.rows)}, "
                   f"{len(self.seeds)} training seed(s)); {self.reused} reused from the run")
        return out


def _path_value(tree: Any, parts: list[str]) -> Any:
    for part in parts:
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _nested(parts: list[str], value: Any) -> dict:
    return {parts[0]: _nested(parts[1:], value)} if len(parts) > 1 else {parts[0]: value}


def _other(protocol: str) -> str:
    return next(p for p in PROTOCOLS if p != protocol)


def flip_overrides(raw: dict, params: Params, key: str, value: Any, names: list[str]) -> tuple[dict, bool]:
    """Overrides of the params file `raw` (validated as `params`) that set protocol key `key` to `value` and keep the
    runs `names` alone as train.runs; and whether the file sets the key itself. An option key
    (train.runs[].options.NAME) is set in every kept entry whose objective takes it."""
    runs = [copy.deepcopy(r) for r, entry in zip(raw["train"]["runs"], params.train.runs) if entry.name in names]
    # the runs kept, and nothing that names a run left out (the search's run, the figures' models; no zoo)
    kept = {"eval": {"zoo": []}, "search": {"run": None}, "viz": {"models": None}, "train": {"runs": runs}}
    if not key.startswith(OPTION_PREFIX):
        parts = key.split(".")
        return deep_merge(_nested(parts, value), kept), _path_value(raw, parts) is not None
    name, pinned = key[len(OPTION_PREFIX):], False
    for r in runs:
        if name in run_entry(params, r["name"]).objective_spec().Options.model_fields:
            options = dict(r.get("options") or {})
            pinned |= options.get(name) is not None
            r["options"] = {**options, name: value}
    return kept, pinned


def _value(params: Params, key: str, names: list[str]) -> Any:
    """The run's value of `key`: its params' (an option: resolved in the first of `names` whose objective takes it)."""
    if not key.startswith(OPTION_PREFIX):
        return _path_value(params.model_dump(mode="json"), key.split("."))
    name = key[len(OPTION_PREFIX):]
    for n in names:
        entry = run_entry(params, n)
        if name in entry.objective_spec().Options.model_fields:
            return run_spec(params, entry)["run"]["options"].get(name, OPTION_KEY_DEFAULTS.get(name))
    return None


def _plain(value: Any) -> Any:
    """`value` as the params' JSON dump holds it (a tuple as a list)."""
    return json.loads(json.dumps(value, default=str))


def _spec(params: Params, name: str, seed: int = 0) -> Any:
    return _plain(run_spec(params, run_entry(params, name), seed))


def plan_ablation(params_path: str | Path, rows: list[str], keys: list[str] | None = None,
                  check_paths: bool = True) -> AblationPlan:
    """Which keys flip, what each retrains and reuses: from the params file alone (no run needed).

    `keys` None: every protocol key whose flip changes the spec of a named row, except those the params file sets
    itself (their value is the file's, not the protocol's; name them to flip them anyway) and those whose flip
    makes the params invalid. ValueError for an unknown row or key, or a named key that changes no named row or
    makes the params invalid."""
    params_path = Path(params_path)
    params = load_params(params_path, check_paths=check_paths)
    if not rows:
        raise ValueError(f"name the rows to ablate with --rows (of train.runs: {[r.name for r in params.train.runs]})")
    names = [e.name for e in with_inits(params, rows)]  # ValueError naming the runs on a typo
    known = [d.key for d in DIFFERENCES]
    unknown = [k for k in keys or [] if k not in known]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not a protocol key; choose among {', '.join(known)}")
    raw = yaml.safe_load(params_path.read_text(encoding="utf-8"))
    protocol = params.run.protocol
    other = _other(protocol)
    plan = AblationPlan(params_path, params, protocol, other, list(rows), list(params.train.seeds), [])
    for key in keys or known:
        to = _plain(protocol_value(key, other))
        overrides, pinned = flip_overrides(raw, params, key, to, names)
        if pinned and keys is None:
            plan.skipped[key] = (f"the params file sets it ({_value(params, key, names)!r}), not {protocol}; name it "
                                 "in --keys to flip it anyway")
            continue
        try:
            flipped = parse_params(deep_merge(raw, overrides), params_root(params_path), check_paths)
        except ParamsError as exc:
            why = f"flipped to {to!r} it makes the params invalid: {exc}"
            if keys is not None:
                raise ValueError(f"{key}: {why}") from None
            plan.skipped[key] = why
            continue
        changed = [n for n in names if _spec(params, n) != _spec(flipped, n)]
        if not changed:
            why = f"it changes the spec of none of {', '.join(names)}"
            if keys is not None:
                raise ValueError(f"{key}: {why} (it acts outside training, or on rows not named): nothing to train; "
                                 "leave it out of --keys")
            plan.skipped[key] = why
            continue
        plan.flips.append(Flip(key, _value(params, key, names), to, pinned, changed,
                               [n for n in names if n not in changed], flipped))
    if not plan.flips:
        raise ValueError(f"no protocol key changes the spec of {', '.join(names)}: "
                         + "; ".join(f"{k}: {w}" for k, w in plan.skipped.items()))
    return plan


def check_finished(run: RunContext, plan: AblationPlan) -> None:
    """The run folder holds the named rows (and their init chain) trained with these params under every training
    seed, their base, and notebook 06's evaluation of them; FileNotFoundError or ValueError naming the fix."""
    command = f"cglib run {plan.params_path}"
    if not (run.dir / "params.yaml").is_file():
        raise FileNotFoundError(f"{run.dir} is not a run folder (no params.yaml): run `{command}` first, or pass "
                                "--run-dir")
    names = sorted({n for f in plan.flips for n in f.changed + f.reused})
    for k in plan.seeds:
        folder = training_dir(run.dir, k)
        if not (folder / INITIAL).with_suffix(".json").is_file():
            raise FileNotFoundError(f"{folder / INITIAL} not found: the run is not trained; run `{command}` first")
        for name in names:
            summary = folder / name / SUMMARY
            if not (summary.is_file() and (folder / name / FINAL).is_file()):
                raise FileNotFoundError(f"{folder / name / FINAL} not found: row {name!r} is not trained under "
                                        f"training seed {k}; run `{command}` (notebook 05_training) first")
            if json.loads(summary.read_text(encoding="utf-8")).get("spec") != _spec(run.params, name, k):
                raise ValueError(f"row {name!r} of {run.dir} (training seed {k}) was trained with other params than "
                                 f"{plan.params_path}: run `{command} --from 05` first, so that the run's rows are "
                                 "these params' rows")
    evaluation = run.dir / "evaluation"
    for file in (RESULTS_FILE, METRICS_FILE, SCORES_FILE):
        if not (evaluation / file).is_file():
            raise FileNotFoundError(f"{evaluation / file} not found: the run is not evaluated; run `{command} --only "
                                    "06` first")
    evaluated = [m["name"] for m in json.loads((evaluation / RESULTS_FILE).read_text(encoding="utf-8"))["models"]]
    missing = [r for r in plan.rows if r not in evaluated]
    if missing:
        raise ValueError(f"rows {', '.join(missing)} are not in the run's evaluation (it scores {evaluated}): run "
                         f"`{command} --only 06` first")


def other_code_notes(run: RunContext, plan: AblationPlan) -> list[str]:
    """A line per named row of the run trained by other library code than this one (its summary's provenance): its
    flipped rows are trained by this code, so its cells would mix the key's change with the code's."""
    out = []
    for name in plan.rows:
        for k in plan.seeds:
            summary = json.loads((training_dir(run.dir, k) / name / SUMMARY).read_text(encoding="utf-8"))
            other = other_code(summary.get("provenance"))
            if other is not None:
                out.append(f"note: row {name!r} of the run (training seed {k}) was trained by {other}, and its flipped "
                           "rows by this code: its cells mix the key's change with the code's; train the run again "
                           f"first (`cglib run {plan.params_path} --from 05 --retrain-changed`)")
                break
    return out


def _keep_base(run: RunContext, flipped: RunContext) -> None:
    """Make the run's base the flipped run's (training/initial.json of this training seed), see the module doc."""
    meta = json.loads((run.training_dir / INITIAL).with_suffix(".json").read_text(encoding="utf-8"))
    want = initial_spec(flipped)
    if meta.get("spec") != want:
        write_json(output_path((flipped.training_dir / INITIAL).with_suffix(".json")),
                   {**meta, "spec": want, "kept_from": {"run": str(run.dir), "spec": meta.get("spec")}})


def _own_files_only(folder: Path) -> None:
    """Remove every link under `folder` (a row the flip retrains: its files are written here, never through)."""
    for root, folders, files in os.walk(folder):
        for name in folders + files:
            if (Path(root) / name).is_symlink():
                (Path(root) / name).unlink()


def _stamp(path: Path) -> tuple[int, int] | None:
    return (path.stat().st_mtime_ns, path.stat().st_size) if path.is_file() and not path.is_symlink() else None


def flipped_run(run: RunContext, flip: Flip, seeds: list[int]) -> RunContext:
    """The flipped run's folder `<run>/ablation/<key>/` over the run (links), with its own params and the run's
    base, the rows the flip changes emptied of links; opened as a run."""
    folder = run.dir / ABLATION_DIR / flip.key.replace("[]", "")
    link_run(run.dir, folder, skip=LINK_SKIP)
    for k in seeds:
        for name in flip.changed:
            _own_files_only(training_dir(folder, k) / name)
    save_params(flip.params, output_path(folder / "params.yaml"))
    flipped = open_run(folder / "params.yaml", folder)
    for k in seeds:
        _keep_base(run.for_training_seed(k), flipped.for_training_seed(k))
    return flipped


@dataclass
class AblationResult:
    """The cells (`cglib.evaluate.ablation.ablation_cells`), the files written, the plan and how many row
    trainings this call made (the others were made by an earlier call)."""

    cells: pd.DataFrame
    paths: dict[str, Path]
    plan: AblationPlan
    trained_now: int


def ablate(params_path: str | Path, rows: list[str], keys: list[str] | None = None,
           run_dir: str | Path | None = None, progress: bool = True) -> AblationResult:
    """Train the named rows of the finished run once per key with only that key flipped, evaluate them, and write
    `<run>/ablation/ablation.csv`, `ablation.md` and the figure `<run>/figures/ablation.png|pdf`."""
    plan = plan_ablation(params_path, rows, keys)
    params = plan.params
    run = RunContext(params, Path(run_dir) if run_dir else params.run_dir(), Path(params_path))
    check_finished(run, plan)
    notes = other_code_notes(run, plan)
    for line in plan.lines() + notes:
        print(line)
    scores, trained_now = {}, 0
    for flip in plan.flips:
        flipped = flipped_run(run, flip, plan.seeds)
        summaries = [training_dir(flipped.dir, k) / name / SUMMARY for k in plan.seeds for name in flip.changed]
        before = [_stamp(p) for p in summaries]
        print(f"{flip.key} -> {flip.to_value!r}: {flipped.dir}")
        train_runs(flipped, prepare_inputs(flipped, progress=progress), progress=progress)
        trained_now += sum(_stamp(p) != b for p, b in zip(summaries, before))
        evaluate_run(flipped, progress=progress)
        scores[flip.key] = load_scores(flipped.dir)
    evaluation = run.dir / "evaluation"
    settings = json.loads((evaluation / RESULTS_FILE).read_text(encoding="utf-8"))["settings"]
    metrics = pd.read_csv(evaluation / METRICS_FILE, dtype={"level": str})
    cells = ablation_cells(metrics, load_scores(run.dir), scores, {f.key: f.changed for f in plan.flips}, plan.rows,
                           {f.key: (f.from_value, f.to_value) for f in plan.flips}, int(settings["bootstrap"]),
                           float(settings["ci"]), int(settings["bootstrap_seed"]))
    counts = {"trained": plan.trainings, "reused": plan.reused, "trained_now": trained_now, "keys": len(plan.flips),
              "rows": len(plan.flips[0].changed + plan.flips[0].reused)}
    markdown = ablation_markdown(cells, run.dir.name, plan.protocol, plan.other, counts, plan.seeds, plan.skipped,
                                 notes)
    paths = write_ablation(cells, run.dir / ABLATION_DIR, markdown)
    apply_style()
    figure = plot_ablation(cells, f"Run {run.dir.name} ({plan.protocol}): one key flipped to its {plan.other} value")
    for path in save_figure(figure, run.figures, FIGURE_STEM, ("png", "pdf"), params.viz.dpi):
        paths[path.suffix[1:]] = path
    plt.close(figure)
    return AblationResult(cells, paths, plan, trained_now)
