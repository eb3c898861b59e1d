"""What the training corrections change (the training side of book/fidelity.md's corrections): Table 3 of the same
world trained as published and trained corrected, cell by cell, with paired CIs.

The evaluation corrections cost no training, so every run scores both evaluation protocols (`protocols.py`). The
training-side ones (optimizer, epoch, pretraining, the CLIP baseline's temperature, the group losses' variants,
the masking, the caption prompt) need the rows trained twice: two runs of one params file that differ only in
`run.protocol` (and `run.name`), e.g. `params/demo.yaml` and `params/demo_as_published.yaml`. Both are scored by
the same (corrected) evaluation protocol, so a cell's change is what training did. The two runs' items can differ
(their generalized captions do, and so do the items drawn from them), so each cell is paired by test image, as
the evaluation-side table is: each image's mean correctness in each run, over the images both score, with the
paired bootstrap over those images (and the training seeds) that every interval of the project uses. Holm's
correction runs over every cell of the table.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from cglib.config.protocol import DIFFERENCES
from cglib.evaluate.bootstrap import Scores, set_difference
from cglib.evaluate.multiplicity import holm
from cglib.evaluate.protocols import image_means
from cglib.evaluate.results import METRICS_FILE, RESULTS_FILE, SCORES_FILE, load_scores
from cglib.evaluate.table3 import table3_columns

TRAINING_CHANGES_CSV = "training_changes.csv"
TRAINING_CHANGES_MD = "training_changes.md"
TWIN_KEYS = {"run.name", "run.protocol"}  # besides what run.protocol sets, the keys two twin runs may differ in
CELL_COLUMNS = ["model", "column", "images", "corrected", "as_published", "change", "ci_low", "ci_high", "p_value",
                "p_holm", "significant"]


def paired_cell(ours: Scores, theirs: Scores, what: str, resamples: int, ci: float, seed: int,
                stream: str) -> dict[str, float]:
    """`ours` minus `theirs` in points on the test images both score (each image's mean per training seed), with
    the paired bootstrap CI and p-value over those images and the seeds; `what` names the pair in errors."""
    common = np.intersect1d(np.unique(ours.units), np.unique(theirs.units))
    a, b = image_means(ours, common), image_means(theirs, common)
    if a.n_seeds != b.n_seeds:
        raise ValueError(f"{what}: {a.n_seeds} training seeds against {b.n_seeds}; train both runs with the same "
                         "train.seeds")
    diff, _ = set_difference([a], [b], resamples, ci, seed, stream=stream)
    return {"images": int(common.size), "ours": 100 * a.mean(), "theirs": 100 * b.mean(), "change": 100 * diff.value,
            "ci_low": 100 * diff.low, "ci_high": 100 * diff.high, "p_value": diff.p_value}


def holm_marked(cells: pd.DataFrame, ci: float) -> pd.DataFrame:
    """`cells` with p_holm (Holm over every cell with a p-value; NaN ones are no test) and significant (the CI
    excludes 0 and p_holm <= 1 - ci)."""
    cells = cells.copy()
    cells["p_holm"] = holm(cells["p_value"].to_numpy(float)) if len(cells) else []
    cells["significant"] = ((cells["ci_low"] > 0) | (cells["ci_high"] < 0)) & (cells["p_holm"] <= 1 - ci)
    return cells


def training_changes(metrics: pd.DataFrame, corrected: dict[tuple[str, ...], dict[str, Scores]],
                     published: dict[tuple[str, ...], dict[str, Scores]], resamples: int, ci: float,
                     seed: int) -> pd.DataFrame:
    """Per model and Table 3 column (the corrected evaluation protocol): the model trained corrected minus the
    same model trained as published, in points, on the test images both runs score, with its paired CI and
    Holm-corrected significance over every cell."""
    rows = []
    for column in table3_columns(metrics):
        key = (column.benchmark, column.labels, column.direction, column.metric, column.level)
        ours, theirs = corrected.get(key, {}), published.get(key, {})
        for model in [m for m in ours if m in theirs]:
            cell = paired_cell(ours[model], theirs[model], f"{model} (corrected against as published)", resamples,
                               ci, seed, stream=f"training|{model}|{column.header}")
            cell["corrected"], cell["as_published"] = cell.pop("ours"), cell.pop("theirs")
            rows.append({"model": model, "column": column.header, **cell})
    return holm_marked(pd.DataFrame(rows, columns=CELL_COLUMNS[:-2]), ci)


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def check_twins(corrected_dir: Path, published_dir: Path) -> None:
    """Both runs' params (params.yaml, as validated) differ only in run.name, run.protocol and what run.protocol
    sets (its keys, the runs' options and pretraining targets), and their protocols are corrected and
    as_published; otherwise a change would not be the protocol's."""
    raw = {}
    for name, directory in (("corrected", corrected_dir), ("as published", published_dir)):
        path = Path(directory) / "params.yaml"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: give the folder of a finished run ({name})")
        raw[name] = _flat(yaml.safe_load(path.read_text(encoding="utf-8")))
    a, b = raw["corrected"], raw["as published"]
    protocols = (a.get("run.protocol"), b.get("run.protocol"))
    if protocols != ("corrected", "as_published"):
        raise ValueError(f"the runs' run.protocol are {protocols[0]} and {protocols[1]}: give the corrected run "
                         "first and the as-published run second")
    allowed = TWIN_KEYS | {d.key for d in DIFFERENCES} | {"train.runs"}
    differ = sorted(k for k in a.keys() | b.keys() if k not in allowed and a.get(k) != b.get(k))
    if [_run_identity(r) for r in a.get("train.runs", [])] != [_run_identity(r) for r in b.get("train.runs", [])]:
        differ.append("train.runs (names, objectives, starting points)")
    if differ:
        raise ValueError(f"the two runs differ in {', '.join(differ)} besides run.protocol: train both from one "
                         "params file that differs only in run.protocol and run.name (e.g. params/demo.yaml and "
                         "params/demo_as_published.yaml)")


def _run_identity(entry: dict) -> tuple:
    return tuple(entry.get(k) for k in ("name", "loss", "init", "groups", "text_source", "tau"))


def compare_runs(corrected_dir: str | Path, published_dir: str | Path) -> pd.DataFrame:
    """`training_changes` of two finished twin runs, with the corrected run's bootstrap settings."""
    check_twins(Path(corrected_dir), Path(published_dir))
    evaluation = Path(corrected_dir) / "evaluation"
    for path in (evaluation / RESULTS_FILE, Path(published_dir) / "evaluation" / SCORES_FILE):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: run both runs through notebook 06_evaluation first")
    settings = json.loads((evaluation / RESULTS_FILE).read_text(encoding="utf-8"))["settings"]
    metrics = pd.read_csv(evaluation / METRICS_FILE, dtype={"level": str})
    return training_changes(metrics, load_scores(corrected_dir), load_scores(published_dir),
                            int(settings["bootstrap"]), float(settings["ci"]), int(settings["bootstrap_seed"]))


def twin_runs(run_dir: Path, protocol: str) -> tuple[Path, Path] | None:
    """(corrected, as published) folders of a run and its twin beside it, when both hold a finished evaluation.
    Twins are named `<name>` (corrected) and `<name>_as_published` (params/demo.yaml and demo_as_published.yaml),
    or `<name>_corrected` and `<name>` (params/paper_corrected.yaml and paper.yaml)."""
    run_dir = Path(run_dir)
    name = run_dir.name
    if protocol == "corrected":
        names = [(name, name + "_as_published")]
        names += [(name, name.removesuffix("_corrected"))] if name.endswith("_corrected") else []
    else:
        names = [(name + "_corrected", name)]
        names += [(name.removesuffix("_as_published"), name)] if name.endswith("_as_published") else []
    for corrected, published in names:
        pair = run_dir.with_name(corrected), run_dir.with_name(published)
        if all((d / "evaluation" / SCORES_FILE).is_file() for d in pair):
            return pair
    return None


def training_changes_markdown(changes: pd.DataFrame, corrected_run: str, published_run: str) -> str:
    """Models x columns, each cell 'change [CI]' with * where significant after Holm, and how it was computed."""
    if changes.empty:
        return "No model and Table 3 column is scored in both runs.\n"
    cells = changes.assign(cell=[f"{r.change:+.1f} [{r.ci_low:+.1f}, {r.ci_high:+.1f}]{' *' if r.significant else ''}"
                                 for r in changes.itertuples()])
    table = cells.pivot(index="model", columns="column", values="cell")
    table = table.loc[list(dict.fromkeys(changes["model"])), list(dict.fromkeys(changes["column"]))]
    lines = ["# What the training corrections change (trained corrected minus trained as published, points)", "",
             "| model | " + " | ".join(table.columns) + " |", "|---" * (len(table.columns) + 1) + "|"]
    lines += [f"| {model} | " + " | ".join(str(v) for v in row) + " |" for model, row in table.iterrows()]
    significant = int(changes["significant"].sum())
    lines += ["", (f"- Runs: `{corrected_run}` (run.protocol: corrected) and `{published_run}` (as_published), one "
              "params file apart from run.protocol; both scored by the corrected evaluation protocol (Table 3's "
              "columns), so a cell is what training did."),
              ("- Each cell: the mean over the training seeds and the test images both runs score of each image's "
              "accuracy, corrected minus as published; paired bootstrap over those images (and the seeds); * marks "
              f"a CI that excludes 0 and survives Holm's correction over all {len(changes)} cells "
              f"({significant} do)."),
              ("- Every training-side protocol key acts at once (the guide's page 'Paper fidelity', "
               "book/fidelity.md); keys the params file sets itself are the same in both runs.")]
    return "\n".join(lines) + "\n"


def write_training_changes(corrected_dir: str | Path, published_dir: str | Path,
                           out_dir: str | Path | None = None) -> tuple[pd.DataFrame, dict[str, Path]]:
    """compare_runs, written as training_changes.csv and .md (default: the corrected run's evaluation folder)."""
    changes = compare_runs(corrected_dir, published_dir)
    out = Path(out_dir) if out_dir is not None else Path(corrected_dir) / "evaluation"
    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out / TRAINING_CHANGES_CSV, "md": out / TRAINING_CHANGES_MD}
    changes.to_csv(paths["csv"], index=False)
    paths["md"].write_text(training_changes_markdown(changes, Path(corrected_dir).name, Path(published_dir).name),
                           encoding="utf-8")
    return changes, paths
