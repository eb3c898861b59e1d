"""Tables and words from saved evaluation results, shared by every report: the tidy columns, formatting, and
per-metric tables (models x levels, labels or directions; paired differences; the forced-choice items).

Table 3 and its notes are in table3.py, the paper's gain rows in gains.py, the automatic reading in reading.py.
Everything there and here is a pure function of the saved files' contents (`metrics.csv`, `differences.csv`,
`results.json`, and for the gain rows `scores.npz`), so the tables and Fig. 4 can be regenerated without re-running
any model.
"""

from __future__ import annotations

import math

import pandas as pd

METRIC_COLUMNS = ["model", "benchmark", "labels", "direction", "metric", "level", "value", "ci_low", "ci_high",
                  "n", "n_queries", "n_excluded", "n_seeds", "seed_sd", "chance", "exposed_to_eval_strings",
                  "exposure"]
DIFF_COLUMNS = ["model_a", "model_b", "benchmark", "labels", "direction", "metric", "level", "difference",
                "ci_low", "ci_high", "n", "n_seeds", "significant", "p_value", "p_holm", "significant_holm"]
SEED_COLUMNS = ["model", "training_seed", "benchmark", "labels", "direction", "metric", "level", "value"]
LABEL_NAMES = {"dag": "MAGIC DAG labels", "ground_truth": "world ground truth", "captions": "captions",
               "hierarcaps": "HierarCaps"}
DIRECTION_NAMES = {"t2i": "text->image", "i2t": "image->text", "-": ""}
BENCHMARK_NAMES = {"forced_choice": "forced choice", "gallery": "gallery retrieval", "coco": "COCO captions",
                   "hierarcaps": "HierarCaps retrieval", "hierarcaps_batch": "HierarCaps in-batch",
                   "hierarcaps_hierarchy": "HierarCaps hierarchy"}
PERCENT_METRICS = ("accuracy", "R@", "P@", "mAP", "precision", "recall")


def is_percent(metric: str) -> bool:
    """Metrics shown in percent (accuracies, recalls, precisions); Kendall tau stays a correlation."""
    return metric.startswith(PERCENT_METRICS)


def select(metrics: pd.DataFrame, benchmark: str, labels: str | None = None, direction: str | None = None,
           metric: str | None = None) -> pd.DataFrame:
    """Rows of one benchmark (and optionally labels, direction, metric)."""
    mask = metrics["benchmark"] == benchmark
    for column, value in (("labels", labels), ("direction", direction), ("metric", metric)):
        if value is not None:
            mask &= metrics[column] == value
    return metrics[mask]


def model_order(metrics: pd.DataFrame) -> list[str]:
    """Models in the order they were evaluated (first appearance in the file)."""
    return list(dict.fromkeys(metrics["model"]))


def seeds_phrase(settings: dict) -> str:
    """How many training seeds a number rests on, for notes: '3 training seeds [0, 1, 2]', '1 training seed [0]'."""
    seeds = settings.get("training_seeds") or [0]
    return f"{len(seeds)} training seed{'s' if len(seeds) > 1 else ''} {seeds}"


def format_interval(value: float, low: float, high: float, digits: int = 1) -> str:
    """'value [low, high]' with `digits` decimals; '-' for a missing value, the value alone without a CI."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if low is None or math.isnan(low):
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def signed(value: float) -> str:
    """'+1.2' / '-1.2', and '+0.0' (not '-0.0') for what rounds to zero."""
    return f"{round(float(value), 1) + 0.0:+.1f}"


def model_label(model: str, exposed: bool) -> str:
    """Row label; a dagger marks models whose training saw the evaluation strings."""
    return f"{model} †" if exposed else model


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub markdown table of a small frame (index as the first column)."""
    header = [frame.index.name or ""] + [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for idx, row in frame.iterrows():
        lines.append("| " + " | ".join([str(idx)] + [str(v) for v in row.tolist()]) + " |")
    return "\n".join(lines)


def metric_table(metrics: pd.DataFrame, benchmark: str, labels: str, direction: str, metric: str) -> pd.DataFrame:
    """Models x levels of one metric as 'value [low, high]' strings (percent where it is a rate)."""
    rows = select(metrics, benchmark, labels, direction, metric)
    scale = 100.0 if is_percent(metric) else 1.0
    digits = 1 if is_percent(metric) else 3
    levels = list(dict.fromkeys(rows["level"]))
    out = pd.DataFrame(index=model_order(rows), columns=levels, dtype=object)
    for _, r in rows.iterrows():
        out.loc[r["model"], r["level"]] = format_interval(scale * r["value"], scale * r["ci_low"], scale * r["ci_high"], digits)
    out.index.name = "model"
    return out


def labels_table(metrics: pd.DataFrame, benchmark: str, direction: str, metric: str, level: str) -> pd.DataFrame:
    """Models x labels of one metric at one level, 'value [low, high]', with each label's chance in the header
    (e.g. keyword_permutation: one column per concept type)."""
    rows = metrics[(metrics["benchmark"] == benchmark) & (metrics["direction"] == direction)
                   & (metrics["metric"] == metric) & (metrics["level"] == level)]
    scale, digits = (100.0, 1) if is_percent(metric) else (1.0, 3)
    headers = {}
    for labels, group in rows.groupby("labels", sort=False):
        chance = group["chance"].mean()
        headers[labels] = f"{labels} (n={int(group['n'].max())}, chance {scale * chance:.{digits}f})" \
            if pd.notna(chance) else f"{labels} (n={int(group['n'].max())})"
    out = pd.DataFrame(index=model_order(rows), columns=list(headers.values()), dtype=object)
    for _, r in rows.iterrows():
        out.loc[r["model"], headers[r["labels"]]] = format_interval(scale * r["value"], scale * r["ci_low"],
                                                        scale * r["ci_high"], digits)
    out.index.name = "model"
    return out


def wide_table(metrics: pd.DataFrame, benchmark: str, labels: str, level: str) -> pd.DataFrame:
    """Models x (direction metric) of one benchmark level, 'value [low, high]' (e.g. COCO R@k both ways)."""
    rows = metrics[(metrics["benchmark"] == benchmark) & (metrics["labels"] == labels) & (metrics["level"] == level)]
    columns = list(dict.fromkeys(f"{DIRECTION_NAMES.get(d, d)} {m}".strip()
                                 for d, m in zip(rows["direction"], rows["metric"])))
    out = pd.DataFrame(index=model_order(rows), columns=columns, dtype=object)
    for _, r in rows.iterrows():
        scale, digits = (100.0, 1) if is_percent(r["metric"]) else (1.0, 3)
        column = f"{DIRECTION_NAMES.get(r['direction'], r['direction'])} {r['metric']}".strip()
        out.loc[r["model"], column] = format_interval(scale * r["value"], scale * r["ci_low"], scale * r["ci_high"], digits)
    out.index.name = "model"
    return out


def difference_table(differences: pd.DataFrame, benchmark: str, labels: str, direction: str, metric: str,
                     model_a: str | None = None) -> pd.DataFrame:
    """Paired differences (model_a - model_b) by level as 'diff [low, high]' (+ '*' when the CI excludes 0)."""
    rows = differences[(differences["benchmark"] == benchmark) & (differences["labels"] == labels)
                       & (differences["direction"] == direction) & (differences["metric"] == metric)]
    if model_a is not None:
        rows = rows[rows["model_a"] == model_a]
    scale = 100.0 if is_percent(metric) else 1.0
    levels = list(dict.fromkeys(rows["level"]))
    pairs = list(dict.fromkeys(zip(rows["model_a"], rows["model_b"])))
    out = pd.DataFrame(index=[f"{a} - {b}" for a, b in pairs], columns=levels, dtype=object)
    for _, r in rows.iterrows():
        cell = format_interval(scale * r["difference"], scale * r["ci_low"], scale * r["ci_high"], 1 if scale > 1 else 3)
        out.loc[f"{r['model_a']} - {r['model_b']}", r["level"]] = cell + (" *" if r["significant"] else "")
    out.index.name = "difference"
    return out


def items_summary(info: dict) -> pd.DataFrame:
    """Per text type: forced-choice items scored and excluded (by reason, first seed), images without text."""
    items = info["items"]
    rows = []
    for name, scored in items["forced_choice_items"].items():
        excluded = next(iter(items["forced_choice_excluded"][name].values()), {})
        rows.append({"text type": name, "scored": scored, "excluded": sum(excluded.values()),
                     "why excluded": "; ".join(f"{k} ({v})" for k, v in excluded.items()) or "-",
                     "images without this text": items["without_text"].get(name, 0)})
    return pd.DataFrame(rows).set_index("text type")


# results.json files written before models carried their objective's family (cglib/train/objectives) name only
# the objective; every objective of that time that is not listed here is of the clip family
_FAMILY_BEFORE_FAMILIES = {"none": "none", "pairwise": "group", "centroid": "group", "re": "text"}


def objective_family(model: dict) -> str:
    """A results.json model's objective family (files from before families: read off its objective's name)."""
    objective = model.get("objective", model.get("loss") or "none")
    return model.get("objective_family") or _FAMILY_BEFORE_FAMILIES.get(objective, "clip")
