"""One protocol key at a time, scored: each named row trained with one key flipped to the other protocol's value
against the same row of the run itself, per Table 3 column, with paired CIs and Holm's correction over the family.

The training side (the flipped runs, where they live, what is reused) is `cglib.ablate`; this module only reads
scores. A cell pairs the flipped model with the run's own on the test images both score (the same MAGIC, so the
same items) and training seed by training seed, with the paired bootstrap every interval of the project uses
(`training_changes.paired_cell`). A row the flip leaves unchanged (its spec is the run's: the run's own weights,
reused) is the same model on both sides: its cells are written (change 0, `trained` false) but are no test, so
Holm's family is every (key, row, column) cell whose row was trained with the key flipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from cglib.evaluate.bootstrap import Scores
from cglib.evaluate.table3 import table3_columns
from cglib.evaluate.training_changes import holm_marked, paired_cell

ABLATION_DIR = "ablation"
ABLATION_CSV = "ablation.csv"
ABLATION_MD = "ablation.md"
CELL_COLUMNS = ["key", "row", "column", "from_value", "to_value", "trained", "images", "run", "flipped", "change",
                "ci_low", "ci_high", "p_value", "p_holm", "significant"]
ScoreTable = dict[tuple[str, ...], dict[str, Scores]]


def ablation_cells(metrics: pd.DataFrame, own: ScoreTable, flipped: Mapping[str, ScoreTable],
                   changed: Mapping[str, Sequence[str]], rows: Sequence[str], values: Mapping[str, tuple[Any, Any]],
                   resamples: int, ci: float, seed: int) -> pd.DataFrame:
    """Per key (of `flipped`), row and Table 3 column of the run's `metrics`: the row trained with the key flipped
    minus the run's own row, in points, with its paired CI; `changed[key]`: the rows the flip retrained (the others
    are the run's own models: change 0, no test); `values[key]`: (the run's value, the flipped value). Holm's
    correction runs over every tested cell."""
    out = []
    for key, scores in flipped.items():
        for row in rows:
            for column in table3_columns(metrics):
                score_key = (column.benchmark, column.labels, column.direction, column.metric, column.level)
                if row not in own.get(score_key, {}):
                    continue
                base = {"key": key, "row": row, "column": column.header, "from_value": str(values[key][0]),
                        "to_value": str(values[key][1]), "trained": row in changed[key]}
                mine = own[score_key][row]
                if not base["trained"]:
                    value = 100 * float(mine.rows().mean()) if mine.units.size else float("nan")
                    out.append({**base, "images": len(set(mine.units.tolist())), "run": value,
                                "flipped": value, "change": 0.0, "ci_low": float("nan"), "ci_high": float("nan"),
                                "p_value": float("nan")})
                    continue
                if row not in scores.get(score_key, {}):
                    raise ValueError(f"{key}: row {row!r} has no {column.header} scores in its flipped run; "
                                     "evaluate that run again (cglib ablate reruns its evaluation)")
                cell = paired_cell(scores[score_key][row], mine, f"{row} with {key} flipped against the run's",
                                   resamples, ci, seed, stream=f"ablation|{key}|{row}|{column.header}")
                cell["flipped"], cell["run"] = cell.pop("ours"), cell.pop("theirs")
                out.append({**base, **cell})
    return holm_marked(pd.DataFrame(out, columns=CELL_COLUMNS[:-2]), ci)[CELL_COLUMNS]


def _cell_text(r: Any) -> str:
    if not r.trained:
        return "= (reused)"
    if not r.images:
        return "no items"
    return f"{r.change:+.1f} [{r.ci_low:+.1f}, {r.ci_high:+.1f}]{' *' if r.significant else ''}"


def ablation_markdown(cells: pd.DataFrame, run_name: str, protocol: str, other: str, counts: Mapping[str, int],
                      seeds: Sequence[int], skipped: Mapping[str, str], notes: Sequence[str] = ()) -> str:
    """Per row, keys x Table 3 columns, each cell 'change [CI]' (* where significant after Holm), the keys' values,
    the training count and how the cells were computed. `counts`: trained, reused and trained_now (row trainings),
    keys and rows (the named rows with their init chain); `notes`: lines said under the tables."""
    lines = [f"# One key at a time: run `{run_name}` ({protocol}), each key flipped to its {other} value", ""]
    if cells.empty:
        lines.append("No named row is scored in a Table 3 column of the run.")
    for row in dict.fromkeys(cells["row"]):
        part = cells[cells["row"] == row].assign(cell=lambda d: [_cell_text(r) for r in d.itertuples()])
        table = part.pivot(index="key", columns="column", values="cell")
        table = table.loc[list(dict.fromkeys(part["key"])), list(dict.fromkeys(part["column"]))]
        lines += [f"## {row} (flipped minus the run's, points)", "",
                  "| key | " + " | ".join(table.columns) + " |", "|---" * (len(table.columns) + 1) + "|"]
        lines += [f"| {key} | " + " | ".join(str(v) for v in values) + " |" for key, values in table.iterrows()]
        lines.append("")
    tested = int(cells["p_value"].notna().sum())
    values = cells.drop_duplicates("key")[["key", "from_value", "to_value"]]
    lines += ["## The keys", ""] + [f"- `{r.key}`: {r.from_value} -> {r.to_value}" for r in values.itertuples()]
    lines += [f"- not flipped: `{key}` ({why})" for key, why in skipped.items()]
    lines += ["", "## How to read it", "",
              (f"- Row trainings: {counts['trained']} = {counts['keys']} keys x {counts['rows']} rows (the named ones "
               f"and those their init names) x {len(seeds)} training seed(s) {list(seeds)}, minus the "
               f"{counts['reused']} whose spec the flip leaves unchanged (the run's own weights, reused); "
               f"{counts['trained_now']} of them trained by this call, the others by an earlier one."),
              ("- Each cell: the row trained with that one key flipped (every other key, the seeds, the base, MAGIC "
               "and the evaluation items are the run's) minus the run's own row, in points: the mean over the "
               "training seeds and the test images of each image's accuracy; paired bootstrap over those images "
               "(and the seeds)."),
              (f"- * marks a CI that excludes 0 and survives Holm's correction over all {tested} tested cells "
               f"({int(cells['significant'].sum())} do); '= (reused)': the flip leaves that row's spec unchanged, "
               "so it is the run's own model and no test."),
              ("- Keys act together in a run: the cells of one key need not add up to what the whole protocol "
               "changes (`cglib compare-protocols` compares two whole twin runs).")]
    lines += [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def write_ablation(cells: pd.DataFrame, out_dir: Path, markdown: str) -> dict[str, Path]:
    """ablation.csv and ablation.md in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out_dir / ABLATION_CSV, "md": out_dir / ABLATION_MD}
    cells.to_csv(paths["csv"], index=False)
    paths["md"].write_text(markdown, encoding="utf-8")
    return paths
