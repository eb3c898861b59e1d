"""Table 3 regenerated from the tidy metrics: its columns, the numbers with CIs, the display, each column's
protocol and chance, the notes under it, the paired differences from the zero-shot model, and table3.md."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cglib.evaluate.multiplicity import holm
from cglib.evaluate.report import (
    format_interval,
    markdown_table,
    model_label,
    model_order,
    objective_family,
    seeds_phrase,
    signed,
)


@dataclass(frozen=True)
class Column:
    """One Table 3 column: its header and the metric row it shows."""

    header: str
    benchmark: str
    labels: str
    direction: str
    metric: str
    level: str


# Table 3 under each evaluation protocol: (forced-choice benchmark, HierarCaps benchmark and metric)
PROTOCOL_COLUMNS = {"corrected": ("forced_choice", "hierarcaps_batch", "R@1"),
                    "as_published": ("forced_choice_published", "hierarcaps_published", "accuracy")}


def table3_columns(metrics: pd.DataFrame, protocol: str = "corrected") -> list[Column]:
    """Table 3's columns present in `metrics`: MAGIC (DAG, then ground truth), HierarCaps, COCO; all text->image.

    The paper's six text types map to: MAGIC captions = generalized captions, l1-l4 = concept names,
    COCO = the original captions, all in the forced choice; HierarCaps = the B-way in-batch R@1 per level
    (corrected) or the authors' 2-way choice against a random item (as_published). `protocol`: corrected (our
    forced choice) or as_published (the authors' sampling and tie rule, to compare with the paper).
    """
    forced, hierarcaps, hc_metric = PROTOCOL_COLUMNS[protocol]
    levels = sorted({lv for lv in metrics["level"] if lv.startswith("l") and lv[1:].isdigit()},
                    key=lambda s: int(s[1:]))
    candidates = [Column("MAGIC captions", forced, "dag", "t2i", "accuracy", "generalized")]
    candidates += [Column(f"MAGIC {lv}", forced, "dag", "t2i", "accuracy", lv) for lv in levels]
    candidates += [Column(f"GT {lv}", forced, "ground_truth", "t2i", "accuracy", lv) for lv in levels]
    candidates += [Column(f"HierarCaps {lv}", hierarcaps, "hierarcaps", "t2i", hc_metric, lv) for lv in levels]
    candidates.append(Column("COCO", forced, "dag", "t2i", "accuracy", "caption"))
    keys = set(map(tuple, metrics[["benchmark", "labels", "direction", "metric", "level"]].to_numpy()))
    return [c for c in candidates if (c.benchmark, c.labels, c.direction, c.metric, c.level) in keys]


def table3(metrics: pd.DataFrame, protocol: str = "corrected") -> pd.DataFrame:
    """Table 3 as numbers: one row per model; per column its value, CI low and high (percent)."""
    columns = table3_columns(metrics, protocol)
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


def table3_headers(table: pd.DataFrame) -> list[str]:
    """The columns of `table3(...)` that hold values (not their CIs, counts, chance, flags or seeds)."""
    return [c for c in table.columns if not c.endswith((" ci_low", " ci_high", " n", " chance"))
            and c not in ("exposed_to_eval_strings", "seeds")]


def table3_values(table: pd.DataFrame) -> pd.DataFrame:
    """Table 3's values alone, models x columns in percent (what a gain is computed from)."""
    return table[table3_headers(table)].astype(float)


def table3_display(table: pd.DataFrame) -> pd.DataFrame:
    """Table 3 with 'value [low, high]' cells, daggers on exposed models (for markdown and notebooks)."""
    headers = table3_headers(table)
    out = pd.DataFrame(index=[model_label(m, bool(table.loc[m, "exposed_to_eval_strings"])) for m in table.index],
                       columns=headers, dtype=object)
    for model, label in zip(table.index, out.index):
        for h in headers:
            out.loc[label, h] = format_interval(table.loc[model, h], table.loc[model, f"{h} ci_low"],
                                     table.loc[model, f"{h} ci_high"])
    if "seeds" in table.columns:  # how many training seeds each row rests on
        out["seeds"] = [str(int(v)) if np.isfinite(v) else "-" for v in table["seeds"].astype(float)]
    out.index.name = "model"
    return out


def table3_protocols(table: pd.DataFrame, info: dict, protocol: str = "corrected") -> dict[str, str]:
    """Each Table 3 column's protocol and chance, for its header: '2-way forced choice, chance 50.0%'."""
    s = info["settings"]
    n_hc = (info.get("hierarcaps") or {}).get("n_items") or s.get("hierarcaps_batch", 100)
    out = {}
    for h in [c for c in table3_display(table).columns if c != "seeds"]:
        if protocol == "as_published":
            kind = f"{s['choices']}-way, as published"
        else:
            kind = (f"{min(s.get('hierarcaps_batch', 100), n_hc)}-way in-batch" if h.startswith("HierarCaps")
                    else f"{s['choices']}-way forced choice")
        chance = table[f"{h} chance"].dropna() if f"{h} chance" in table.columns else pd.Series(dtype=float)
        out[h] = kind + (f", chance {chance.iloc[0]:.1f}%" if len(chance) else "")
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
            f"{signed(r['difference'])} [{r['ci_low']:.1f}, {r['ci_high']:.1f}]" + (" *" if r["significant"] else ""))
        grid.loc[r["model"], r["column"]] = cell
    grid.index.name = "model - zero-shot"
    n = int(np.isfinite(table["p_value"].to_numpy(float)).sum())
    return ["## Paired difference from the zero-shot model (points)", "", markdown_table(grid.fillna("-")), "",
            (f"- {n} cells compared with the zero-shot model (scored cells with a p-value), each paired (same items, "
             f"seed k against seed k); * marks a difference whose {100 * ci:.0f}% CI excludes 0 and that stays "
             f"significant after Holm's correction over the {n} cells (family-wise error {100 * (1 - ci):.0f}%).")]


def table3_markdown(table: pd.DataFrame, notes: Sequence[str] = (), shown_gains: pd.DataFrame | None = None,
                    gain_notes: Sequence[str] = (), protocols: dict[str, str] | None = None,
                    zero_shot: Sequence[str] = ()) -> str:
    """table3.md: the table with its 95% CIs, our gain rows under the model rows (when given: as
    `gains.gains_display` shows them), the notes that say how every column was computed, then the gains' notes,
    then `zero_shot` (`zero_shot_section`). `protocols` (`table3_protocols`) puts each column's protocol and chance
    in its header."""
    display = table3_display(table)
    if shown_gains is not None and not shown_gains.empty:
        display = pd.concat([display, shown_gains.reindex(columns=display.columns).astype(object).fillna("-")])
        display.index.name = "model"
    if protocols:
        display = display.rename(columns={h: f"{h} ({p})" for h, p in protocols.items()})
    body = markdown_table(display)
    lines = ["# Table 3 (regenerated)", "", body, "", *[f"- {n}" for n in notes]]
    if shown_gains is not None:
        lines += ["", "## Gain rows, our definition (Avg Accuracy Gain w.r.t., paired CIs)", "",
                  *[f"- {n}" for n in gain_notes]]
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
    for m in info["models"]:  # the HierarCaps rows (a text objective: RE) say whose weights they are
        if objective_family(m) == "text":
            notes.append(f"{m['name']}: HierarCaps' RE alignment, "
                         + ("the authors' released weights (options.released)." if m.get("weights") == "released"
                            else "trained here (no released weights given or present)."))
    zoo = [m for m in info["models"] if m.get("zoo")]
    if zoo:
        notes.append("Zoo (frozen reference models, eval.zoo; not trained in this run, in no gain set): "
                     + "; ".join(f"{m['name']} = {zoo_spec_label(m.get('spec') or {})}" for m in zoo) + ".")
    for name, why in (info.get("zoo_skipped") or {}).items():
        notes.append(f"Zoo model {name} skipped, not scored (results.json zoo_skipped): {why}.")
    exposed = [m for m in info["models"] if m["exposed_to_eval_strings"]]
    if exposed:  # each row with what it saw: pretraining on the names, RE on MAGIC's chains, inherited through init
        notes.append("† training saw the evaluation strings: " + "; ".join(
            f"{m['name']}: {', '.join(m.get('exposure') or ['reason not recorded in its summary'])}"
            for m in exposed) + ".")
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

