"""Tables and words from saved evaluation results: tidy metrics, Table 3, paired differences, a short reading.

Everything here is a pure function of the saved files' contents (`metrics.csv`, `differences.csv`,
`results.json`, and for the gain rows `scores.npz`), so the tables and Fig. 4 can be regenerated without re-running
any model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cglib.evaluate.bootstrap import Scores, set_difference
from cglib.evaluate.multiplicity import holm

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

# The paper's Table 3 (text->image "R@1", as the authors compute it: a 2-way forced choice), for reference.
PAPER_TABLE3 = pd.DataFrame(
    [[69.7, 67.7, 59.7, 56.5, 57.2, 91.1, 93.0, 91.4, 90.5, 96.6],
     [74.2, 68.7, 59.5, 55.9, 57.4, 90.4, 92.9, 91.1, 90.3, 94.1],
     [74.1, 70.2, 61.3, 57.3, 58.9, 92.4, 93.6, 92.6, 91.4, 96.8],
     [74.8, 71.1, 61.7, 57.3, 59.1, 92.8, 93.9, 93.7, 93.6, 96.2],
     [77.2, 73.8, 61.0, 58.6, 57.5, 91.4, 92.9, 87.4, 84.6, 88.0]],
    index=pd.Index(["CLIP", "CLIP fine-tuned", "CLEAR GLASS centroid", "CLEAR GLASS pairwise",
                    "pairwise + pretraining"], name="model"),
    columns=["MAGIC captions", "MAGIC l1", "MAGIC l2", "MAGIC l3", "MAGIC l4",
             "HierarCaps l1", "HierarCaps l2", "HierarCaps l3", "HierarCaps l4", "COCO"])


@dataclass(frozen=True)
class Column:
    """One Table 3 column: its header and the metric row it shows."""

    header: str
    benchmark: str
    labels: str
    direction: str
    metric: str
    level: str


def is_percent(metric: str) -> bool:
    """Metrics shown in percent (accuracies, recalls, precisions); Kendall tau stays a correlation."""
    return metric.startswith(PERCENT_METRICS)


def table3_columns(metrics: pd.DataFrame) -> list[Column]:
    """Table 3's columns present in `metrics`: MAGIC (DAG, then ground truth), HierarCaps, COCO; all text->image.

    The paper's six text types map to: MAGIC captions = generalized captions, l1-l4 = concept names,
    COCO = the original captions, all in the forced choice; HierarCaps = the B-way in-batch R@1 per level.
    """
    levels = sorted({lv for lv in metrics["level"] if lv.startswith("l") and lv[1:].isdigit()},
                    key=lambda s: int(s[1:]))
    candidates = [Column("MAGIC captions", "forced_choice", "dag", "t2i", "accuracy", "generalized")]
    candidates += [Column(f"MAGIC {lv}", "forced_choice", "dag", "t2i", "accuracy", lv) for lv in levels]
    candidates += [Column(f"GT {lv}", "forced_choice", "ground_truth", "t2i", "accuracy", lv) for lv in levels]
    candidates += [Column(f"HierarCaps {lv}", "hierarcaps_batch", "hierarcaps", "t2i", "R@1", lv)
                   for lv in levels]
    candidates.append(Column("COCO", "forced_choice", "dag", "t2i", "accuracy", "caption"))
    keys = set(map(tuple, metrics[["benchmark", "labels", "direction", "metric", "level"]].to_numpy()))
    return [c for c in candidates if (c.benchmark, c.labels, c.direction, c.metric, c.level) in keys]


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


def table3(metrics: pd.DataFrame) -> pd.DataFrame:
    """Table 3 as numbers: one row per model; per column its value, CI low and high (percent)."""
    columns = table3_columns(metrics)
    rows = []
    for model in model_order(metrics):
        m = metrics[metrics["model"] == model]
        row: dict[str, object] = {"model": model, "exposed_to_eval_strings": bool(m["exposed_to_eval_strings"].any())}
        for c in columns:
            hit = m[(m["benchmark"] == c.benchmark) & (m["labels"] == c.labels) & (m["direction"] == c.direction)
                    & (m["metric"] == c.metric) & (m["level"] == c.level)]
            if hit.empty:
                continue
            r = hit.iloc[0]
            row[c.header] = 100 * r["value"]
            row[f"{c.header} ci_low"] = 100 * r["ci_low"]
            row[f"{c.header} ci_high"] = 100 * r["ci_high"]
            row[f"{c.header} n"] = int(r["n"])
            row[f"{c.header} chance"] = 100 * r["chance"] if "chance" in r else float("nan")
        if "n_seeds" in m.columns and m["n_seeds"].notna().any():
            row["seeds"] = int(m["n_seeds"].max())
        rows.append(row)
    return pd.DataFrame(rows).set_index("model")


def seeds_phrase(settings: dict) -> str:
    """How many training seeds a number rests on, for notes: '3 training seeds [0, 1, 2]', '1 training seed [0]'."""
    seeds = settings.get("training_seeds") or [0]
    return f"{len(seeds)} training seed{'s' if len(seeds) > 1 else ''} {seeds}"


def _fmt(value: float, low: float, high: float, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if low is None or math.isnan(low):
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def model_label(model: str, exposed: bool) -> str:
    """Row label; a dagger marks models whose training saw the evaluation strings."""
    return f"{model} †" if exposed else model


def table3_display(table: pd.DataFrame) -> pd.DataFrame:
    """Table 3 with 'value [low, high]' cells, daggers on exposed models (for markdown and notebooks)."""
    headers = [c for c in table.columns if not c.endswith((" ci_low", " ci_high", " n", " chance"))
               and c not in ("exposed_to_eval_strings", "seeds")]
    out = pd.DataFrame(index=[model_label(m, bool(table.loc[m, "exposed_to_eval_strings"])) for m in table.index],
                       columns=headers, dtype=object)
    for model, label in zip(table.index, out.index):
        for h in headers:
            out.loc[label, h] = _fmt(table.loc[model, h], table.loc[model, f"{h} ci_low"],
                                     table.loc[model, f"{h} ci_high"])
    if "seeds" in table.columns:  # how many training seeds each row rests on
        out["seeds"] = [str(int(v)) if np.isfinite(v) else "-" for v in table["seeds"].astype(float)]
    out.index.name = "model"
    return out


def table3_protocols(table: pd.DataFrame, info: dict) -> dict[str, str]:
    """Each Table 3 column's protocol and chance, for its header: '2-way forced choice, chance 50.0%'."""
    s = info["settings"]
    n_hc = (info.get("hierarcaps") or {}).get("n_items") or s.get("hierarcaps_batch", 100)
    out = {}
    for h in [c for c in table3_display(table).columns if c != "seeds"]:
        protocol = (f"{min(s.get('hierarcaps_batch', 100), n_hc)}-way in-batch" if h.startswith("HierarCaps")
                    else f"{s['choices']}-way forced choice")
        chance = table[f"{h} chance"].dropna() if f"{h} chance" in table.columns else pd.Series(dtype=float)
        out[h] = protocol + (f", chance {chance.iloc[0]:.1f}%" if len(chance) else "")
    return out


def zero_shot_differences(differences: pd.DataFrame, metrics: pd.DataFrame, ci: float = 0.95,
                          reference: str = "zero-shot") -> pd.DataFrame:
    """Every model minus the zero-shot model per Table 3 column (points, paired CI), Holm-adjusted over the
    cells of this table: columns difference, ci_low, ci_high, p_value, p_holm, significant (after Holm)."""
    rows = []
    for c in table3_columns(metrics) if len(metrics) else []:
        d = differences[(differences["benchmark"] == c.benchmark) & (differences["labels"] == c.labels)
                        & (differences["direction"] == c.direction) & (differences["metric"] == c.metric)
                        & (differences["level"] == c.level)]
        for model in model_order(metrics):
            if model == reference:
                continue
            hit, sign = d[(d["model_a"] == model) & (d["model_b"] == reference)], 1.0
            if hit.empty:
                hit, sign = d[(d["model_a"] == reference) & (d["model_b"] == model)], -1.0
            if hit.empty:
                continue
            r = hit.iloc[0]
            low, high = sorted((sign * 100 * r["ci_low"], sign * 100 * r["ci_high"]))
            rows.append({"model": model, "column": c.header, "difference": sign * 100 * r["difference"],
                         "ci_low": low, "ci_high": high, "n_seeds": r.get("n_seeds", 1),
                         "p_value": r.get("p_value", float("nan"))})
    out = pd.DataFrame(rows, columns=["model", "column", "difference", "ci_low", "ci_high", "n_seeds", "p_value"])
    out["p_holm"] = holm(out["p_value"].to_numpy(float))
    ci_excludes_0 = (out["ci_low"] > 0) | (out["ci_high"] < 0)
    out["significant"] = ci_excludes_0 & (out["p_holm"] <= 1 - ci)
    return out


def zero_shot_section(differences: pd.DataFrame, metrics: pd.DataFrame, ci: float = 0.95) -> list[str]:
    """table3.md's section under the gain rows: each model minus the zero-shot model per column, and a note that
    says how many cells were compared and that '*' is significance after Holm's correction over them."""
    table = zero_shot_differences(differences, metrics, ci)
    if table.empty:
        return []
    grid = pd.DataFrame(index=list(dict.fromkeys(table["model"])), columns=list(dict.fromkeys(table["column"])),
                        dtype=object)
    for _, r in table.iterrows():
        cell = "-" if not np.isfinite(r["difference"]) else (
            f"{_signed(r['difference'])} [{r['ci_low']:.1f}, {r['ci_high']:.1f}]" + (" *" if r["significant"] else ""))
        grid.loc[r["model"], r["column"]] = cell
    grid.index.name = "model - zero-shot"
    n = int(np.isfinite(table["p_value"].to_numpy(float)).sum())
    return ["## Paired difference from the zero-shot model (points)", "", markdown_table(grid.fillna("-")), "",
            (f"- {n} cells compared with the zero-shot model (scored cells with a p-value), each paired (same items, "
             f"seed k against seed k); * marks a difference whose {100 * ci:.0f}% CI excludes 0 and that stays "
             f"significant after Holm's correction over the {n} cells (family-wise error {100 * (1 - ci):.0f}%).")]


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub markdown table of a small frame (index as the first column)."""
    header = [frame.index.name or ""] + [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for idx, row in frame.iterrows():
        lines.append("| " + " | ".join([str(idx)] + [str(v) for v in row.tolist()]) + " |")
    return "\n".join(lines)


def table3_markdown(table: pd.DataFrame, notes: Sequence[str] = (), gains: pd.DataFrame | None = None,
                    gain_notes: Sequence[str] = (), protocols: dict[str, str] | None = None,
                    zero_shot: Sequence[str] = ()) -> str:
    """table3.md: the table with its 95% CIs, the paper's gain rows under the model rows (when `gains` is
    given, see `gain_rows`), the notes that say how every column was computed, then the gains' notes, then
    `zero_shot` (`zero_shot_section`). `protocols` (`table3_protocols`) puts each column's protocol and chance
    in its header."""
    display = table3_display(table)
    if gains is not None and not gains.empty:
        shown = gains_display(gains)
        display = pd.concat([display, shown.reindex(columns=display.columns).astype(object).fillna("-")])
        display.index.name = "model"
    if protocols:
        display = display.rename(columns={h: f"{h} ({p})" for h, p in protocols.items()})
    body = markdown_table(display)
    lines = ["# Table 3 (regenerated)", "", body, "", *[f"- {n}" for n in notes]]
    if gains is not None:
        lines += ["", "## Gain rows (Avg Accuracy Gain w.r.t.)", "", *[f"- {n}" for n in gain_notes]]
    if zero_shot:
        lines += ["", *zero_shot]
    return "\n".join([*lines, ""])


def style_table3(table: pd.DataFrame):
    """A pandas Styler of Table 3: 'value [CI]' cells shaded by value (per column)."""
    display = table3_display(table)
    values = table[[c for c in display.columns]].astype(float)
    values.index = display.index
    styler = display.style
    for column in [c for c in display.columns if c != "seeds"]:
        styler = styler.background_gradient(cmap="Greens", subset=[column], gmap=values[column], axis=0)
    return styler.set_caption("Table 3: text->image accuracy (%) with 95% bootstrap CIs")


def metric_table(metrics: pd.DataFrame, benchmark: str, labels: str, direction: str, metric: str) -> pd.DataFrame:
    """Models x levels of one metric as 'value [low, high]' strings (percent where it is a rate)."""
    rows = select(metrics, benchmark, labels, direction, metric)
    scale = 100.0 if is_percent(metric) else 1.0
    digits = 1 if is_percent(metric) else 3
    levels = list(dict.fromkeys(rows["level"]))
    out = pd.DataFrame(index=model_order(rows), columns=levels, dtype=object)
    for _, r in rows.iterrows():
        out.loc[r["model"], r["level"]] = _fmt(scale * r["value"], scale * r["ci_low"], scale * r["ci_high"], digits)
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
        out.loc[r["model"], headers[r["labels"]]] = _fmt(scale * r["value"], scale * r["ci_low"],
                                                        scale * r["ci_high"], digits)
    out.index.name = "model"
    return out


def read_results(metrics: pd.DataFrame, differences: pd.DataFrame, comparisons: Sequence[tuple[str, str]],
                 benchmark: str = "forced_choice", labels: str = "dag", direction: str = "t2i",
                 metric: str = "accuracy") -> list[str]:
    """A short automatic reading: each comparison's significant differences by level, and chance checks.

    The cells read (every comparison at every level) are one family: a difference is called significant only
    when its paired 95% bootstrap CI excludes 0 and its p-value stays below 5% after Holm's correction over
    the family; the first sentence says how many cells that is. A CI that excludes 0 without surviving the
    correction is called nominal. Files without p-values (written before them) fall back to the CI alone.
    """
    unit = "points" if is_percent(metric) else ""
    scale = 100.0 if is_percent(metric) else 1.0
    where = f"{BENCHMARK_NAMES.get(benchmark, benchmark)}, {DIRECTION_NAMES[direction]}, " \
            f"{LABEL_NAMES.get(labels, labels)}, {metric}"
    diffs = differences[(differences["benchmark"] == benchmark) & (differences["labels"] == labels)
                        & (differences["direction"] == direction) & (differences["metric"] == metric)]
    n_seeds = int(diffs["n_seeds"].max()) if "n_seeds" in diffs.columns and diffs["n_seeds"].notna().any() else 1
    if n_seeds > 1:  # every number says how many training seeds it rests on
        where += f"; means over {n_seeds} training seeds"
    cells = []  # (a, b, level, difference, low, high, p) in a's favour
    for a, b in comparisons:
        rows = diffs[(diffs["model_a"] == a) & (diffs["model_b"] == b)]
        sign = 1.0
        if rows.empty:
            rows = diffs[(diffs["model_a"] == b) & (diffs["model_b"] == a)]
            sign = -1.0
        for _, r in rows.iterrows():
            lo, hi = sorted((sign * scale * r["ci_low"], sign * scale * r["ci_high"]))
            cells.append((a, b, r["level"], sign * scale * r["difference"], lo, hi, r.get("p_value", np.nan)))
    p_values = np.array([c[6] for c in cells], dtype=float)
    with_p = np.isfinite(p_values)
    adjusted = holm(p_values)
    alpha = 0.05
    sentences = []
    if with_p.sum() > 1:
        sentences.append(f"{int(with_p.sum())} paired differences are read below ({where}); a difference is called "
                         f"significant only when its 95% CI excludes 0 and it survives Holm's correction over all "
                         f"{int(with_p.sum())} (family-wise error 5%).")
    for a, b in dict.fromkeys((c[0], c[1]) for c in cells):
        wins, losses, nominal, ties, unscored = [], [], [], [], []
        for i, (ca, cb, level, d, lo, hi, _) in enumerate(cells):
            if (ca, cb) != (a, b):
                continue
            if not np.isfinite(d):
                unscored.append(level)
                continue
            text = f"{level} by {abs(d):.1f} {unit} (95% CI [{lo:.1f}, {hi:.1f}])".replace("  ", " ")
            excludes_0 = lo > 0 or hi < 0
            survives = not with_p[i] or adjusted[i] <= alpha
            if excludes_0 and survives:
                (wins if lo > 0 else losses).append(text)
            elif excludes_0:
                nominal.append(f"{level} ({d:+.1f} [{lo:.1f}, {hi:.1f}], Holm p = {adjusted[i]:.2g})")
            else:
                ties.append(f"{level} ({d:+.1f} [{lo:.1f}, {hi:.1f}])")
        parts = []
        if wins:
            parts.append(f"{a} beats {b} at " + "; ".join(wins))
        if losses:
            parts.append(f"{a} is worse than {b} at " + "; ".join(losses))
        if nominal:
            parts.append("nominal only (the CI excludes 0, not significant after Holm's correction) at "
                         + ", ".join(nominal))
        if ties:
            parts.append("no significant difference (paired CI includes 0) at " + ", ".join(ties))
        if unscored:
            parts.append("no scorable item at " + ", ".join(unscored))
        sentences.append(f"{a} vs {b} ({where}): " + "; ".join(parts) + ".")
    rows = select(metrics, benchmark, labels, direction, metric)
    for model in model_order(rows):
        m = rows[(rows["model"] == model) & rows["chance"].notna() & rows["value"].notna()]
        at_chance = [r["level"] for _, r in m.iterrows() if r["ci_low"] <= r["chance"] <= r["ci_high"]]
        if len(m) and at_chance:
            sentences.append(f"{model}: indistinguishable from chance (CI covers it) at {len(at_chance)} of {len(m)} "
                             f"text types ({', '.join(at_chance)}).")
    return sentences


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
        cell = _fmt(scale * r["difference"], scale * r["ci_low"], scale * r["ci_high"], 1 if scale > 1 else 3)
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


def table3_notes(info: dict) -> list[str]:
    """The notes printed under Table 3: how each column was computed, the items, the exposures."""
    s = info["settings"]
    notes = [
        (f"Cells: text->image accuracy in %, the mean over {seeds_phrase(s)}; 95% bootstrap CI in brackets "
         f"({s['bootstrap']} resamples of "
         + ("the training seeds, then the test " if len(s.get("training_seeds") or [0]) > 1 else "the test ")
         + f"{'images' if s.get('bootstrap_unit', 'image') == 'image' else 'l1 groups'}"
         + (", one draw shared by the drawn seeds" if len(s.get("training_seeds") or [0]) > 1 else "")
         + f"); negatives sampled with evaluation seeds {s['seeds']}. Each column header states its protocol "
         "(M-way forced choice, B-way in-batch) and its chance: what a random-scoring model gets on the same items, "
         "averaged over the sampling seeds (the untrained model is no random scorer: compare with the zero-shot "
         "row, by the paired differences below the table)."),
        ("MAGIC captions = generalized captions; MAGIC l1-l4 = concept names from the DAG (magic.json); COCO = "
         "the original captions; all scored with the fixed forced-choice protocol (no identical-text negatives, "
         "ties wrong, distinct negative groups); negatives from the hard negatives of the image's "
         + ("l1 group." if s.get("negative_source", "group") == "group" else "node at the evaluated level.")),
        (f"Test images: {info['items']['n_test_images']} in {info['items']['n_groups']} l1 groups; items without "
         "M-1 valid negatives are excluded and counted in results.json (items.forced_choice_excluded)."),
    ]
    left_out = info["items"].get("text_exclusions", {}).get("generalized", {})
    if left_out:
        notes.append(f"MAGIC captions: {sum(left_out.values())} test images whose generalization failed (their "
                     "generalized captions are fallback copies of original captions) are left out of this column "
                     "(eval.include_generalized_fallback: true scores them).")
    if info["items"]["ground_truth"]:
        notes.append("GT l1-l4: the same protocol with the synthetic world's ground-truth concept names as texts "
                     "(the DAG's chains are the pipeline's estimate of them).")
    if info.get("hierarcaps"):
        notes.append(f"HierarCaps l1-l4: {s['hierarcaps_batch']}-way in-batch R@1 (a hit is any image with the "
                     f"same text at that level), {info['hierarcaps']['n_items']} items.")
        notes.append(hierarcaps_items_note(info["hierarcaps"]))
    for m in info["models"]:  # the HierarCaps rows say whose RE weights they are
        if m.get("objective") == "re":
            notes.append(f"{m['name']}: HierarCaps' RE alignment, "
                         + ("the authors' released weights (train.runs released)." if m.get("weights") == "released"
                            else "trained here (no released weights given or present)."))
    zoo = [m for m in info["models"] if m.get("zoo")]
    if zoo:
        notes.append("Zoo (frozen reference models, eval.zoo; not trained in this run, in no gain set): "
                     + "; ".join(f"{m['name']} = {zoo_spec_label(m.get('spec') or {})}" for m in zoo) + ".")
    for name, why in (info.get("zoo_skipped") or {}).items():
        notes.append(f"Zoo model {name} skipped, not scored (results.json zoo_skipped): {why}.")
    if any(m["exposed_to_eval_strings"] for m in info["models"]):
        notes.append("† training saw the evaluation strings (textual pretraining with the l1-l4 concept names).")
    return notes


def zoo_spec_label(spec: dict) -> str:
    """A zoo model's spec in a few words: source, name, pretrained tag, checkpoint."""
    parts = [str(spec.get("name", "?"))]
    if spec.get("source") not in (None, "open_clip"):
        parts.insert(0, f"{spec['source']}:")
    if spec.get("pretrained"):
        parts.append(f"({spec['pretrained']})")
    if spec.get("checkpoint"):
        parts.append(f"checkpoint {spec['checkpoint']}")
    return " ".join(parts)


def wide_table(metrics: pd.DataFrame, benchmark: str, labels: str, level: str) -> pd.DataFrame:
    """Models x (direction metric) of one benchmark level, 'value [low, high]' (e.g. COCO R@k both ways)."""
    rows = metrics[(metrics["benchmark"] == benchmark) & (metrics["labels"] == labels) & (metrics["level"] == level)]
    columns = list(dict.fromkeys(f"{DIRECTION_NAMES.get(d, d)} {m}".strip()
                                 for d, m in zip(rows["direction"], rows["metric"])))
    out = pd.DataFrame(index=model_order(rows), columns=columns, dtype=object)
    for _, r in rows.iterrows():
        scale, digits = (100.0, 1) if is_percent(r["metric"]) else (1.0, 3)
        column = f"{DIRECTION_NAMES.get(r['direction'], r['direction'])} {r['metric']}".strip()
        out.loc[r["model"], column] = _fmt(scale * r["value"], scale * r["ci_low"], scale * r["ci_high"], digits)
    out.index.name = "model"
    return out


# ------------------------------------------------------------------ gains (the paper's rows under Table 3)
BASE_MODEL = "zero-shot"
PRETRAIN_MODES = ("none", "leakage_free", "with_concepts")
# results.json files written before models carried their objective's family (cglib/train/objectives) name only
# the objective; every objective of that time that is not listed here is of the clip family
_FAMILY_BEFORE_FAMILIES = {"none": "none", "pairwise": "group", "centroid": "group", "re": "text"}
GAINS = ("MAGIC", "Loss Function", "Pretraining", "Best Model")
GAIN_LABEL = "Avg Accuracy Gain w.r.t. {}"
GAIN_COLUMNS = ["gain", "column", "benchmark", "labels", "direction", "metric", "level", "models_a", "models_b",
                "mean_a", "mean_b", "difference", "ci_low", "ci_high", "relative", "relative_ci_low",
                "relative_ci_high", "n", "n_seeds", "p_value", "p_holm", "significant"]


@dataclass(frozen=True)
class ModelRole:
    """What a model is, as far as the gain rows need it (saved per model in results.json's `models`).

    fine_tuned_on_magic: trained on this run's MAGIC image-text pairs. objective: the objective of its last
    training phase (`none`: never trained, the base model; `clip`, `pairwise`, `centroid` on MAGIC; `re`: the
    HierarCaps Radial Embedding alignment, not on MAGIC). pretrain: the textual pretraining before the MAGIC
    phase. init: the model its training started from (None for the base). So CLIP zero-shot = (False, none),
    a CLEAR GLASS run = (True, pairwise|centroid, init zero-shot), the HierarCaps model = (False, re), and
    "HierarCaps fine-tuned" = (True, clip, init = the HierarCaps model's name). zoo: a frozen reference model
    (`eval.zoo`, e.g. OpenAI's CLIP next to a run's own base): (False, none) too, but neither the base nor a
    candidate for the best model, and in no gain set.
    """

    name: str
    fine_tuned_on_magic: bool
    objective: str
    pretrain: str = "none"
    init: str | None = None
    exposed: bool = False
    zoo: bool = False
    related: bool = False  # trained with a related method (issue #21): a row everywhere, in no gain set
    family: str = "none"  # the objective's family (Objective.family): clip, group, text; none for the base

    @property
    def is_base(self) -> bool:
        return self.objective == "none" and not self.fine_tuned_on_magic and self.init is None and not self.zoo


def model_roles(models: Sequence[dict]) -> dict[str, ModelRole]:
    """Each model's role from results.json's `models` list (in order).

    Files written before the role fields existed carry `loss` (None for the zero-shot model) and `pretrain`:
    objective = loss or none, fine-tuned on MAGIC when a loss is set, init = the zero-shot model. Any objective is
    accepted (your own too): the gain rows read its family (`objective_family`), never its name.
    """
    roles = {}
    for m in models:
        loss = m.get("loss")
        objective = m.get("objective", loss or "none")
        pretrain = m.get("pretrain") or "none"
        fine_tuned = bool(m.get("fine_tuned_on_magic", loss is not None))
        init = m.get("init", None if objective == "none" and not fine_tuned else BASE_MODEL)
        family = m.get("objective_family") or _FAMILY_BEFORE_FAMILIES.get(objective, "clip")
        if family not in ("none", "clip", "group", "text"):
            raise ValueError(f"model {m['name']!r}: objective {objective!r} has family {family!r}, not one of clip, "
                             "group, text (cglib.train.objectives.FAMILIES); fix the objective's `family`")
        if pretrain not in PRETRAIN_MODES:
            raise ValueError(f"model {m['name']!r}: pretrain {pretrain!r} is not one of {', '.join(PRETRAIN_MODES)}")
        roles[m["name"]] = ModelRole(m["name"], fine_tuned, objective, pretrain, init,
                                     bool(m.get("exposed_to_eval_strings", False)), bool(m.get("zoo", False)),
                                     bool(m.get("related")), family)
    return roles


def best_model(metrics: pd.DataFrame, roles: dict[str, ModelRole]) -> str | None:
    """The Table 3 row (other than a base or zoo model) with the highest mean over the Table 3 columns; None if
    none."""
    table = table3(metrics) if len(metrics) else pd.DataFrame()
    headers = [c.header for c in table3_columns(metrics)] if len(metrics) else []
    candidates = [m for m in table.index if m in roles and not roles[m].is_base and not roles[m].zoo
                  and not roles[m].related]
    if not candidates or not headers:
        return None
    means = table.loc[candidates, headers].astype(float).mean(axis=1, skipna=True)
    return None if means.isna().all() else str(means.idxmax())


def gain_sets(roles: dict[str, ModelRole], best: str | None) -> dict[str, tuple[list[str], list[str], str]]:
    """Per gain: (models averaged on the gaining side, models of the reference side, why absent or '').

    Zoo models (frozen references, `ModelRole.zoo`) and models of the related methods (`ModelRole.related`) enter
    no set: the gains are the paper's, over the paper's rows.
    """
    roles = {n: r for n, r in roles.items() if not r.zoo and not r.related}
    ft = [r for r in roles.values() if r.fine_tuned_on_magic]
    out: dict[str, tuple[list[str], list[str], str]] = {}
    out["MAGIC"] = ([r.name for r in ft], [r.name for r in roles.values() if not r.fine_tuned_on_magic],
                    "needs models fine-tuned on MAGIC and models not fine-tuned on it")
    out["Loss Function"] = ([r.name for r in ft if r.family == "group"],
                            [r.name for r in ft if r.family == "clip"],
                            "needs models fine-tuned with a group loss (pairwise, centroid) and with the CLIP loss")
    plain = {(r.objective, r.init): r.name for r in ft if r.pretrain == "none"}
    pretrained = [r for r in ft if r.pretrain != "none" and (r.objective, r.init) in plain]
    out["Pretraining"] = ([r.name for r in pretrained],
                          list(dict.fromkeys(plain[(r.objective, r.init)] for r in pretrained)),
                          "needs a model with textual pretraining and one with the same objective (and start) "
                          "without it" if any(r.pretrain != "none" for r in ft)
                          else "no model with textual pretraining in this run (train.runs: pretrain)")
    out["Best Model"] = ([best] if best else [], [r.name for r in roles.values() if r.is_base],
                         "needs a trained model and the zero-shot (base) model")
    return {g: (a, b, "" if a and b else why) for g, (a, b, why) in out.items()}


def gain_rows(metrics: pd.DataFrame, scores: dict[tuple[str, ...], dict[str, Scores]],
              roles: dict[str, ModelRole], resamples: int, ci: float, seed: int, stream: str = ""
              ) -> tuple[pd.DataFrame, list[str]]:
    """The paper's "Avg Accuracy Gain w.r.t." rows under Table 3, per Table 3 column, and notes.

    Gains: MAGIC (fine-tuned on MAGIC minus not), Loss Function (group losses, with or without pretraining,
    minus the CLIP loss), Pretraining (textual pretraining minus the same objective without), Best Model
    (the row with the highest mean over the columns minus the zero-shot model). Each gain is the mean of one
    set's values minus the other's, in points (`difference`), and relative to the reference set's mean in %
    (`relative`), both with paired 95% bootstrap CIs over the test images (`set_difference`: the per-item
    `scores` of both sets resampled with the same draws as every other interval of the run, given the same
    `seed`). `mean_a`/`mean_b` are in %. A gain whose sets are empty is absent and a note says why.
    """
    columns = table3_columns(metrics) if len(metrics) else []
    sets = gain_sets(roles, best_model(metrics, roles))
    rows = []
    for gain, (a, b, _) in sets.items():
        if not (a and b):
            continue
        for c in columns:
            by_model = scores.get((c.benchmark, c.labels, c.direction, c.metric, c.level), {})
            sa, sb = [m for m in a if m in by_model], [m for m in b if m in by_model]
            if not (sa and sb):
                continue
            diff, rel = set_difference([by_model[m] for m in sa], [by_model[m] for m in sb], resamples, ci, seed,
                                       stream)
            rows.append({"gain": gain, "column": c.header, "benchmark": c.benchmark, "labels": c.labels,
                         "direction": c.direction, "metric": c.metric, "level": c.level,
                         "models_a": ";".join(sa), "models_b": ";".join(sb),
                         "mean_a": 100 * float(np.mean([by_model[m].mean() for m in sa])),
                         "mean_b": 100 * float(np.mean([by_model[m].mean() for m in sb])),
                         "difference": 100 * diff.value, "ci_low": 100 * diff.low, "ci_high": 100 * diff.high,
                         "relative": 100 * rel.value, "relative_ci_low": 100 * rel.low,
                         "relative_ci_high": 100 * rel.high, "n": diff.n_units, "n_seeds": diff.n_seeds,
                         "p_value": diff.p_value, "significant": diff.significant})
    gains = pd.DataFrame(rows, columns=GAIN_COLUMNS)
    # every gain cell is one family: significant = the CI excludes 0 and Holm's correction over them keeps it
    gains["p_holm"] = holm(gains["p_value"].to_numpy(float))
    survives = gains["p_holm"].le(1 - ci) | gains["p_value"].isna()
    gains["significant"] = gains["significant"].astype(bool) & survives
    return gains, gain_notes(gains, sets, roles, resamples, ci)


def _names(models: Sequence[str], roles: dict[str, ModelRole]) -> str:
    return ", ".join(model_label(m, roles[m].exposed) for m in models)


def gain_notes(gains: pd.DataFrame, sets: dict[str, tuple[list[str], list[str], str]],
               roles: dict[str, ModelRole], resamples: int, ci: float) -> list[str]:
    """How the gain rows were computed, the models entering each mean, and which gains are not significant."""
    what = {"MAGIC": "fine-tuned on MAGIC minus not fine-tuned on it",
            "Loss Function": "group losses, pairwise or centroid with or without pretraining, minus the CLIP loss, "
                             "all fine-tuned on MAGIC",
            "Pretraining": "textual pretraining minus the same objective and start without it",
            "Best Model": "the best row, the highest mean over the Table 3 columns, minus the zero-shot model"}
    notes = [(f"Gain rows: mean of the first set of models minus mean of the second, in points; in parentheses "
              f"relative to the second set's mean (%); {100 * ci:.0f}% paired bootstrap CI over the test images "
              f"({resamples} resamples, both sets resampled together"
              + (f"; hierarchical over the {int(gains['n_seeds'].max())} training seeds, seed k of every model "
                 "together" if len(gains) and gains["n_seeds"].max() > 1 else "")
              + f"); * marks a CI that excludes 0 and survives Holm's correction over the {len(gains)} gain cells.")]
    for gain, (a, b, why) in sets.items():
        if not (a and b):
            notes.append(f"{gain}: absent: {why}.")
            continue
        note = f"{gain} ({what[gain]}): mean of {_names(a, roles)} minus mean of {_names(b, roles)}."
        rows = gains[gains["gain"] == gain]
        unscored = [r["column"] for _, r in rows.iterrows() if not np.isfinite(r["difference"])]
        flat = [r["column"] for _, r in rows.iterrows()
                if np.isfinite(r["difference"]) and r["ci_low"] <= 0 <= r["ci_high"]]
        nominal = [r["column"] for _, r in rows.iterrows() if np.isfinite(r["difference"]) and not r["significant"]
                   and not r["ci_low"] <= 0 <= r["ci_high"]]
        if flat:
            note += f" Not significant (the CI contains 0) at {', '.join(flat)}."
        if nominal:
            note += f" Nominal only (the CI excludes 0, not after Holm's correction) at {', '.join(nominal)}."
        if not flat and not nominal and len(rows) > len(unscored):
            note += " Significant at every scored column."
        if unscored:
            note += f" No scorable item at {', '.join(unscored)}."
        if gain == "Best Model":
            note += (" The best row is chosen on these test items, so this gain is optimistic: its CI does not "
                     "cover the choice.")
        notes.append(note)
    zoo = [r.name for r in roles.values() if r.zoo]
    if zoo:
        notes.append(f"Zoo models ({', '.join(zoo)}: frozen reference models, eval.zoo) are in no gain set: neither "
                     "the base, nor the best model, nor on either side of a gain.")
    return notes


def _signed(value: float) -> str:
    """'+1.2' / '-1.2', and '+0.0' (not '-0.0') for what rounds to zero."""
    return f"{round(float(value), 1) + 0.0:+.1f}"


def gains_display(gains: pd.DataFrame) -> pd.DataFrame:
    """The gain rows as the paper prints them: one row per gain, 'diff [low, high] (relative %)' per column."""
    order = [g for g in GAINS if g in set(gains["gain"])]
    columns = list(dict.fromkeys(gains["column"]))
    out = pd.DataFrame(index=[GAIN_LABEL.format(g) for g in order], columns=columns, dtype=object)
    for _, r in gains.iterrows():
        if not np.isfinite(r["difference"]):
            cell = "-"
        else:
            cell = f"{_signed(r['difference'])} [{r['ci_low']:.1f}, {r['ci_high']:.1f}]"
            cell += f" ({_signed(r['relative'])}%)" if np.isfinite(r["relative"]) else ""
            cell += " *" if bool(r["significant"]) else ""
        out.loc[GAIN_LABEL.format(r["gain"]), r["column"]] = cell
    out.index.name = "gain"
    return out.fillna("-")


FEW_HIERARCAPS_ITEMS = 400  # the unseen items the hierarcaps profile is sized to keep (DESIGN.md, data roles)


def hierarcaps_items_note(hierarcaps: dict) -> str:
    """Which HierarCaps items the numbers rest on: unseen only (the default, with the count left out) or also the
    images this run trained on (eval.hierarcaps_include_train), and a warning when few remain."""
    n, seen = hierarcaps["n_items"], hierarcaps["overlap_with_run_images"]["train"]
    if hierarcaps.get("include_train", True):
        if not seen:
            return f"HierarCaps: all {n} items scored; none of their images is in this run's MAGIC train split."
        return (f"HierarCaps: all {n} items scored, {seen} of them on images in this run's MAGIC train split "
                "(eval.hierarcaps_include_train: true): the trained models saw those images and their COCO captions "
                "in training; compare with care.")
    note = (f"HierarCaps: {n} items scored, all on images unseen in training; {hierarcaps['left_out_train']} left out "
            "because their image is in this run's MAGIC train split (eval.hierarcaps_include_train: true scores them).")
    if n < FEW_HIERARCAPS_ITEMS:
        note += (f" Only {n} unseen items remain (fewer than {FEW_HIERARCAPS_ITEMS}): expect wide CIs; a larger "
                 "magic.test_fraction leaves more.")
    return note
