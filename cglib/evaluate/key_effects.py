"""Which protocol key moves which cell: the twin comparison (`training_changes`) beside each twin's one-key
ablation (`ablation`), in one direction.

The twins differ in every protocol key at once; a cell of `training_changes` is the corrected run's model minus
the as-published run's. Each twin's `cglib ablate` flips one key at a time from that run's protocol to the other:
in the as-published run, flipped minus the run is what correcting that key alone does there; in the corrected run,
flipped minus the run is what un-correcting it does, so its sign is turned. Every number here then reads
"with the key corrected minus with it as published", like the twins' cells, each from its own family: the twins'
Holm runs over the twin table, each ablation's over its own tested cells (their significance is each file's).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from cglib.evaluate.ablation import ABLATION_CSV, ABLATION_DIR

KEY_EFFECTS_CSV = "key_effects.csv"
KEY_EFFECTS_MD = "key_effects.md"
KEY_EFFECTS_STEM = "key_effects"  # the figure, key_effects.png|pdf beside them
TWINS = "all keys (the twins)"
COLUMNS = ["row", "column", "key", "source", "change", "ci_low", "ci_high", "p_holm", "significant"]


def read_ablation(run_dir: Path) -> pd.DataFrame | None:
    """A run's `ablation/ablation.csv` (written by `cglib ablate`), or None when it has none."""
    path = Path(run_dir) / ABLATION_DIR / ABLATION_CSV
    return pd.read_csv(path) if path.is_file() else None


def key_effects(changes: pd.DataFrame, in_published: pd.DataFrame | None,
                in_corrected: pd.DataFrame | None) -> pd.DataFrame:
    """Long table (COLUMNS) over the rows either ablation trained: per row and Table 3 column, the twins' change,
    then per key its change flipped alone in the as-published run and in the corrected run (sign turned), all as
    corrected minus as published. A key the ablation left a row unchanged for (reused) is not listed for it."""
    out = []
    ablations = [(s, cells) for s, cells in (("in_as_published", in_published), ("in_corrected", in_corrected))
                 if cells is not None]
    rows = list(dict.fromkeys(r for _, cells in ablations for r in cells.loc[cells["trained"], "row"]))
    for row in rows:
        twin = changes[changes["model"] == row]
        for t in twin.itertuples():
            out.append({"row": row, "column": t.column, "key": TWINS, "source": "twins", "change": t.change,
                        "ci_low": t.ci_low, "ci_high": t.ci_high, "p_holm": t.p_holm,
                        "significant": bool(t.significant)})
        alone = []
        for source, cells in ablations:
            sign = -1.0 if source == "in_corrected" else 1.0  # + 0.0 below: a turned 0 prints as +0.0, not -0.0
            for c in cells[(cells["row"] == row) & cells["trained"]].itertuples():
                low, high = sorted((sign * c.ci_low + 0.0, sign * c.ci_high + 0.0))
                alone.append({"row": row, "column": c.column, "key": c.key, "source": source,
                              "change": sign * c.change + 0.0, "ci_low": low, "ci_high": high, "p_holm": c.p_holm,
                              "significant": bool(c.significant)})
        keys = list(dict.fromkeys(a["key"] for a in alone))
        out += sorted(alone, key=lambda a: keys.index(a["key"]))  # a key's two runs side by side (a stable sort)
    return pd.DataFrame(out, columns=COLUMNS)


def _text(r) -> str:
    return f"{r.change:+.1f}{'*' if r.significant else ''}"


def key_effects_markdown(effects: pd.DataFrame, corrected_run: str, published_run: str) -> str:
    """Per ablated row, keys x Table 3 columns: the twins' change, then each key's 'alone in the as-published
    run / alone in the corrected run' (* where its own family's Holm keeps it), and how to read it."""
    lines = ["# Which key moves which cell (with the key corrected minus as published, points)", ""]
    if effects.empty:
        return "\n".join(lines + ["Neither twin has a one-key ablation (`cglib ablate`) of a row both score."]) + "\n"
    for row in dict.fromkeys(effects["row"]):
        part = effects[effects["row"] == row]
        columns = list(dict.fromkeys(part["column"]))
        lines += [f"## {row}", "", "| key | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
        for key in dict.fromkeys(part["key"]):
            cells = []
            for column in columns:
                here = part[(part["key"] == key) & (part["column"] == column)].set_index("source")
                texts = [_text(here.loc[s]) if s in here.index else "-"
                         for s in (["twins"] if key == TWINS else ["in_as_published", "in_corrected"])]
                cells.append(" / ".join(texts))
            lines.append(f"| {key} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## How to read it", "",
              (f"- First row of each table: `{corrected_run}` minus `{published_run}` (every protocol key at once, "
               "`training_changes.md`). Each key's cell: 'a / b', a = that key alone switched to its corrected "
               f"value in `{published_run}` (its ablation: flipped minus the run), b = that key alone switched to "
               f"its as-published value in `{corrected_run}`, with the sign turned. Both read 'corrected minus as "
               "published', as the first row does; '-': that twin has no ablation of the key."),
              ("- * marks a change whose CI excludes 0 after Holm's correction in its own family (the twin table; "
               "each ablation's tested cells); each ablation's file gives the intervals (`ablation/ablation.md`)."),
              ("- A key that moves a cell alone in both runs, in the twins' direction, accounts for part of the twin "
               "change on its own. Keys act together: the single-key changes need not add up to the first row, "
               "and a key may move a cell in one run only.")]
    return "\n".join(lines) + "\n"


def twin_key_effects(corrected_dir: str | Path, published_dir: str | Path, changes: pd.DataFrame) -> pd.DataFrame:
    """`key_effects` of two twin runs: `changes` (`training_changes.compare_runs` of the two) and each run's
    ablation, where it has one (empty when neither has)."""
    return key_effects(changes, read_ablation(Path(published_dir)), read_ablation(Path(corrected_dir)))


def write_key_effects(effects: pd.DataFrame, out_dir: Path, corrected_run: str,
                      published_run: str) -> dict[str, Path]:
    """key_effects.csv and key_effects.md in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out_dir / KEY_EFFECTS_CSV, "md": out_dir / KEY_EFFECTS_MD}
    effects.to_csv(paths["csv"], index=False)
    paths["md"].write_text(key_effects_markdown(effects, corrected_run, published_run), encoding="utf-8")
    return paths
