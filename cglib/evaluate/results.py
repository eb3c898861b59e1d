"""The result files of an evaluation under `<run>/evaluation/` (see pipeline.py): writing them, and reading them back
as `EvalResults` (`load_results`) or as the per-query scores behind every number (`load_scores`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cglib.evaluate.benchmarks import Key
from cglib.evaluate.bootstrap import Scores
from cglib.evaluate.gains import GAIN_COLUMNS, gains_display, model_roles
from cglib.evaluate.gallery import MetricScores
from cglib.evaluate.loading import ZERO_SHOT
from cglib.evaluate.paper import table3_as_published_markdown
from cglib.evaluate.protocols import CHANGE_COLUMNS, protocol_changes_markdown
from cglib.evaluate.reading import read_results
from cglib.evaluate.report import METRIC_COLUMNS, SEED_COLUMNS, metric_table
from cglib.evaluate.table3 import table3_markdown, table3_notes, table3_protocols, zero_shot_section
from cglib.run import RunContext, output_path, provenance, write_json

RESULTS_FILE = "results.json"
METRICS_FILE = "metrics.csv"
DIFFERENCES_FILE = "differences.csv"
SCORES_FILE = "scores.npz"
GAINS_FILE = "gains.csv"
MODELS_DIR = "models"  # evaluate_model's results: evaluation/models/<NAME>/
BASE_DIR = "base"  # evaluate_base's results (notebook 05): evaluation/base/
SEEDS_FILE = "seeds.csv"
PUBLISHED_CSV, PUBLISHED_MD = "table3_as_published.csv", "table3_as_published.md"
CHANGES_CSV = "protocol_changes.csv"


@dataclass
class EvalResults:
    """Saved evaluation results: tidy metrics, paired differences, Table 3, and the rest of results.json."""

    metrics: pd.DataFrame
    differences: pd.DataFrame
    table3: pd.DataFrame
    info: dict
    directory: Path
    paths: dict[str, Path] = field(default_factory=dict)
    gains: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=GAIN_COLUMNS))
    seeds: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SEED_COLUMNS))
    table3_published: pd.DataFrame = field(default_factory=pd.DataFrame)  # the authors' protocol (as_published)
    protocol_changes: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=CHANGE_COLUMNS))

    @property
    def models(self) -> list[str]:
        return [m["name"] for m in self.info["models"]]

    def comparisons(self) -> list[tuple[str, str]]:
        """Default comparisons: each trained model vs the zero-shot model and each group loss vs the CLIP loss."""
        models = self.info["models"]
        clip = [m["name"] for m in models if m.get("loss") == "clip"]
        pairs = [(m["name"], ZERO_SHOT) for m in models if m["name"] != ZERO_SHOT]
        pairs += [(m["name"], c) for m in models for c in clip if m.get("loss") not in (None, "clip")]
        return pairs

    def reading(self, **selection: str) -> list[str]:
        """The automatic reading of one metric (default: forced choice, text->image, DAG labels, accuracy)."""
        return read_results(self.metrics, self.differences, self.comparisons(), **selection)

    def table(self, benchmark: str, labels: str, direction: str, metric: str) -> pd.DataFrame:
        """Models x levels of one metric, 'value [low, high]'."""
        return metric_table(self.metrics, benchmark, labels, direction, metric)

    def notes(self) -> list[str]:
        """How each Table 3 column was computed, the items, the exposures (as in table3.md)."""
        return table3_notes(self.info)

    def gain_notes(self) -> list[str]:
        """How the gain rows under Table 3 were computed, the models in each mean, what is not significant."""
        return list((self.info.get("gains") or {}).get("notes", []))


def write_results(out_dir: Path, run: RunContext, metrics: pd.DataFrame, differences: pd.DataFrame, table: pd.DataFrame,
           info: dict, scores: dict[Key, dict[str, MetricScores]], gains: pd.DataFrame,
           seeds_table: pd.DataFrame, published: pd.DataFrame | None = None,
           changes: pd.DataFrame | None = None) -> dict[str, Path]:
    paths = {"metrics": out_dir / METRICS_FILE, "differences": out_dir / DIFFERENCES_FILE,
             "seeds": out_dir / SEEDS_FILE,
             "table3_csv": out_dir / "table3.csv", "table3_md": out_dir / "table3.md",
             "table3_published_csv": out_dir / PUBLISHED_CSV, "table3_published_md": out_dir / PUBLISHED_MD,
             "protocol_changes": out_dir / CHANGES_CSV,
             "gains": out_dir / GAINS_FILE, "scores": out_dir / SCORES_FILE, "results": out_dir / RESULTS_FILE}
    paths = {key: output_path(path) for key, path in paths.items()}  # a linked run's files become this run's own
    metrics.to_csv(paths["metrics"], index=False)
    seeds_table.to_csv(paths["seeds"], index=False)
    differences.to_csv(paths["differences"], index=False)
    table.to_csv(paths["table3_csv"])
    gains.to_csv(paths["gains"], index=False)
    paths["table3_md"].write_text(table3_markdown(
        table, table3_notes(info), gains_display(gains), info["gains"]["notes"], table3_protocols(table, info),
        zero_shot_section(differences, metrics, info["settings"].get("ci", 0.95))), encoding="utf-8")
    if published is not None and not published.empty:
        published.to_csv(paths["table3_published_csv"])
        changes = changes if changes is not None else pd.DataFrame(columns=CHANGE_COLUMNS)
        changes.to_csv(paths["protocol_changes"], index=False)
        paths["table3_published_md"].write_text(table3_as_published_markdown(
            published, table3_protocols(published, info, "as_published"), info["settings"]["choices"],
            model_roles(info["models"]), protocol_changes_markdown(changes)), encoding="utf-8")
    else:
        del paths["table3_published_csv"], paths["table3_published_md"], paths["protocol_changes"]
    arrays = {}
    for key, by_model in scores.items():
        for model, ms in by_model.items():
            arrays[f"{'|'.join(key)}|{model}|values"] = ms.scores.values
            arrays[f"{'|'.join(key)}|{model}|units"] = ms.scores.units
    np.savez_compressed(paths["scores"], **arrays)
    record = {**info, "provenance": provenance(run.params, stage="evaluation"),
              "metrics": metrics.to_dict(orient="records"), "differences": differences.to_dict(orient="records")}
    write_json(paths["results"], record)
    return paths


def load_results(run_dir: str | Path) -> EvalResults:
    """Read the files `evaluate_run` wrote under `<run_dir>/evaluation/`."""
    directory = Path(run_dir) / "evaluation"
    path = directory / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run notebook 06_evaluation (cglib.evaluate.evaluate_run) first")
    info = json.loads(path.read_text(encoding="utf-8"))
    info.pop("metrics", None)
    info.pop("differences", None)
    metrics = pd.read_csv(directory / METRICS_FILE, dtype={"exposure": str, "level": str})
    for column, default in (("n_seeds", 1), ("seed_sd", float("nan"))):  # files written before train.seeds
        if column not in metrics.columns:
            metrics.insert(METRIC_COLUMNS.index(column), column, default)
    metrics["exposure"] = metrics["exposure"].fillna("")
    differences = pd.read_csv(directory / DIFFERENCES_FILE)
    table = pd.read_csv(directory / "table3.csv", index_col="model")
    gains_path = directory / GAINS_FILE  # absent in evaluations written before the gain rows
    gains = (pd.read_csv(gains_path, dtype={"level": str, "models_a": str, "models_b": str}) if gains_path.is_file()
             else pd.DataFrame(columns=GAIN_COLUMNS))
    seeds = (pd.read_csv(directory / SEEDS_FILE, dtype={"level": str, "training_seed": str})
             if (directory / SEEDS_FILE).is_file() else pd.DataFrame(columns=SEED_COLUMNS))
    published = (pd.read_csv(directory / PUBLISHED_CSV, index_col="model") if (directory / PUBLISHED_CSV).is_file()
                 else pd.DataFrame())  # absent in evaluations written before both protocols were scored
    changes = (pd.read_csv(directory / CHANGES_CSV) if (directory / CHANGES_CSV).is_file()
               else pd.DataFrame(columns=CHANGE_COLUMNS))
    return EvalResults(metrics=metrics, differences=differences, table3=table, info=info, directory=directory,
                       paths={p.stem: p for p in directory.iterdir() if p.is_file()}, gains=gains, seeds=seeds,
                       table3_published=published, protocol_changes=changes)


def load_scores(run_dir: str | Path) -> dict[tuple[str, ...], dict[str, Scores]]:
    """The per-query scores behind every metric: {(benchmark, labels, direction, metric, level): {model: Scores}}."""
    out: dict[tuple[str, ...], dict[str, Scores]] = {}
    with np.load(Path(run_dir) / "evaluation" / SCORES_FILE) as f:
        for name in f.files:
            if not name.endswith("|values"):
                continue
            *key, model, _ = name.split("|")
            out.setdefault(tuple(key), {})[model] = Scores(f[name], f[name[: -len("values")] + "units"])
    return out
