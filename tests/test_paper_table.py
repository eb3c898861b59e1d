"""The paper beside us: its Table 3 and gain rows as printed, and the paper's rule for its gain rows, which gives 38
of the 40 printed cells from the paper's own table (truncated to one decimal, not rounded)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cglib.evaluate import paper
from cglib.evaluate.gains import GAINS, model_roles

# results.json's `models` for a run with the paper's eight rows under this library's names (params/paper.yaml)
RUN_MODELS = [
    {"name": "zero-shot", "fine_tuned_on_magic": False, "objective": "none", "pretrain": "none", "init": None},
    {"name": "clip", "fine_tuned_on_magic": True, "objective": "clip", "objective_family": "clip",
     "init": "zero-shot"},
    {"name": "hierarcaps", "fine_tuned_on_magic": False, "objective": "re", "objective_family": "text",
     "init": "zero-shot"},
    {"name": "hierarcaps_clip", "fine_tuned_on_magic": True, "objective": "clip", "objective_family": "clip",
     "init": "hierarcaps"},
    {"name": "centroid", "fine_tuned_on_magic": True, "objective": "centroid", "objective_family": "group",
     "init": "zero-shot"},
    {"name": "centroid_pretrain", "fine_tuned_on_magic": True, "objective": "centroid",
     "objective_family": "group", "pretrain": "with_concepts", "init": "zero-shot"},
    {"name": "pairwise", "fine_tuned_on_magic": True, "objective": "pairwise", "objective_family": "group",
     "init": "zero-shot"},
    {"name": "pairwise_pretrain", "fine_tuned_on_magic": True, "objective": "pairwise",
     "objective_family": "group", "pretrain": "with_concepts", "init": "zero-shot"},
]


def run_table() -> pd.DataFrame:
    """The paper's Table 3 under the run's row names (same order as RUN_MODELS)."""
    return paper.PAPER_TABLE3.set_axis([m["name"] for m in RUN_MODELS], axis=0)


def test_the_paper_table_holds_all_eight_rows_as_printed():
    """Eight model rows and four gain rows over the ten columns; spot checks against the paper's numbers."""
    assert paper.PAPER_TABLE3.shape == (8, 10) and paper.PAPER_GAINS.shape == (4, 10)
    assert list(paper.PAPER_GAINS.index) == list(GAINS)
    assert set(paper.PAPER_ROLES) == set(paper.PAPER_TABLE3.index)
    assert paper.PAPER_TABLE3.loc["HierarCaps fine-tuned", "HierarCaps l4"] == 78.6
    assert paper.PAPER_TABLE3.loc["centroid + pretraining", "COCO"] == 88.1
    assert paper.PAPER_GAINS.loc["Pretraining", "MAGIC captions"] == 6.9


def test_the_papers_rule_reproduces_38_of_the_40_printed_cells():
    """The rule on the paper's own Table 3 gives every printed cell but Loss Function at HierarCaps l3 and
    Pretraining at HierarCaps l4; both misses recomputed by hand."""
    check = paper.paper_rule_check()
    assert len(check) == 40 and int(check["reproduced"].sum()) == 38
    misses = check[~check["reproduced"]]
    assert list(misses.index) == [("Loss Function", "HierarCaps l3"), ("Pretraining", "HierarCaps l4")]
    # Loss Function at HierarCaps l3: the four group-loss rows over the other four
    group, other = (92.6 + 87.0 + 93.7 + 87.4) / 4, (91.4 + 91.1 + 89.7 + 87.8) / 4
    assert misses.loc[("Loss Function", "HierarCaps l3"), "computed"] == pytest.approx(100 * (group / other - 1))
    assert round(100 * (group / other - 1), 2) == 0.19 and misses.loc[("Loss Function", "HierarCaps l3"),
                                                                      "printed"] == -2.5
    # Pretraining at HierarCaps l4: the two pretrained rows over the other six
    pretrained, rest = (83.4 + 84.6) / 2, (90.5 + 90.3 + 84.4 + 78.6 + 91.4 + 93.6) / 6
    assert misses.loc[("Pretraining", "HierarCaps l4"), "computed"] == pytest.approx(100 * (pretrained / rest - 1))
    assert round(100 * (pretrained / rest - 1), 2) == -4.69 and misses.loc[("Pretraining", "HierarCaps l4"),
                                                                           "printed"] == -3.4
    # paper_gains is the same rule, truncated
    computed = paper.paper_gains(paper.PAPER_TABLE3)
    assert int(np.isclose(computed, paper.PAPER_GAINS, rtol=0, atol=1e-9).sum()) == 38


def test_truncation_toward_zero_not_rounding_reproduces_the_printed_cells():
    """Rounding to one decimal reproduces 22 cells and truncating toward minus infinity 30; only truncation
    toward zero gives 38. The cells that tell them apart, by hand."""
    check = paper.paper_rule_check()
    assert int(np.isclose(check["rounded"], check["printed"]).sum()) == 22
    floor = np.floor((check["computed"] * 10).round(6)) / 10
    assert int(np.isclose(floor, check["printed"]).sum()) == 30
    # Loss Function at MAGIC l3: group rows over the other four, 4.8957 -> printed 4.8 (rounding: 4.9)
    group, other = (57.3 + 58.2 + 57.3 + 58.6) / 4, (56.5 + 55.9 + 56.0 + 52.2) / 4
    assert 100 * (group / other - 1) == pytest.approx(4.8957, abs=1e-4)
    assert check.loc[("Loss Function", "MAGIC l3"), ["printed", "truncated", "rounded"]].tolist() == [4.8, 4.8, 4.9]
    # MAGIC at MAGIC l2: 0.869 -> 0.8 (rounding: 0.9)
    assert check.loc[("MAGIC", "MAGIC l2"), "computed"] == pytest.approx(0.869, abs=1e-3)
    assert check.loc[("MAGIC", "MAGIC l2"), ["printed", "truncated", "rounded"]].tolist() == [0.8, 0.8, 0.9]
    # a negative: MAGIC at COCO, -3.565 -> -3.5 (toward zero; toward minus infinity it would be -3.6)
    assert check.loc[("MAGIC", "COCO"), "computed"] == pytest.approx(-3.565, abs=1e-3)
    assert check.loc[("MAGIC", "COCO"), ["printed", "truncated"]].tolist() == [-3.5, -3.5]


def test_truncate_tenths_survives_float_error_and_gives_no_negative_zero():
    values = pd.DataFrame([[4.8 - 1e-12, -3.5 + 1e-12, -0.04, 0.0999]])
    out = paper.truncate_tenths(values).iloc[0].tolist()
    assert out == [4.8, -3.5, 0.0, 0.0] and not np.signbit(out[2])


def test_best_model_is_the_best_row_of_each_column_over_the_other_seven():
    """By hand at COCO (CLEAR GLASS centroid, 96.8) and MAGIC captions (centroid + pretraining, 77.4)."""
    t = paper.PAPER_TABLE3
    best = paper.best_rows(t, paper.PAPER_ROLES)
    assert best["COCO"] == "CLEAR GLASS centroid" and best["MAGIC captions"] == "centroid + pretraining"
    values = paper.paper_gain_values(t)
    for column in ("COCO", "MAGIC captions"):
        others = t[column].drop(best[column])
        assert len(others) == 7
        assert values.loc["Best Model", column] == pytest.approx(100 * (t.loc[best[column], column] / others.mean()
                                                                        - 1))


def test_a_runs_rows_enter_by_role_not_by_name():
    """The paper's table under a run's row names, roles from results.json's `models`: the same gains; each row
    maps onto its paper row; a zoo and a related-method row (absurd values) change nothing."""
    roles = model_roles(RUN_MODELS)
    assert [paper.paper_row(m, roles) for m in roles] == list(paper.PAPER_TABLE3.index)
    pd.testing.assert_frame_equal(paper.paper_gains(run_table(), roles), paper.paper_gains(paper.PAPER_TABLE3))
    extra = RUN_MODELS + [{"name": "openai", "zoo": True}, {"name": "clip_hn", "fine_tuned_on_magic": True,
                                                             "objective": "clip_hn", "objective_family": "clip",
                                                             "related": True, "init": "zero-shot"}]
    roles = model_roles(extra)
    table = pd.concat([run_table(), pd.DataFrame(99.9, index=["openai", "clip_hn"], columns=paper.COLUMNS)])
    assert paper.paper_row("openai", roles) is None and paper.paper_row("clip_hn", roles) is None
    pd.testing.assert_frame_equal(paper.paper_gains(table, roles), paper.paper_gains(paper.PAPER_TABLE3))
    with pytest.raises(ValueError, match="no role: pass roles for every row"):
        paper.paper_gains(table, model_roles(RUN_MODELS))


def test_absent_rows_make_the_reference_set_what_the_run_has_with_a_note():
    """Without the two HierarCaps rows MAGIC's reference set is CLIP alone, and the note names what is absent; a
    run without pretraining has no Pretraining gain."""
    models = [m for m in RUN_MODELS if not m["name"].startswith("hierarcaps")]
    roles, table = model_roles(models), run_table().drop(["hierarcaps", "hierarcaps_clip"])
    gains = paper.paper_gain_values(table, roles)
    fine_tuned = table.drop("zero-shot").mean()
    pd.testing.assert_series_equal(gains.loc["MAGIC"], 100 * (fine_tuned / table.loc["zero-shot"] - 1),
                                   check_names=False)
    notes = paper.paper_gain_notes(table, roles)
    magic = next(n for n in notes if n.startswith("MAGIC:"))
    assert "over mean of zero-shot (CLIP)." in magic and "also hold HierarCaps fine-tuned, HierarCaps" in magic
    plain = [m for m in models if m.get("pretrain", "none") == "none"]
    roles, table = model_roles(plain), table.loc[[m["name"] for m in plain]]
    assert paper.paper_gains(table, roles).loc["Pretraining"].isna().all()
    assert "Pretraining: absent: this table has no row with the factor." in paper.paper_gain_notes(table, roles)


def test_table3_as_published_shows_the_rule_beside_the_printed_gain_rows():
    """table3_as_published.md: this run's gain rows by the paper's rule, each followed by the paper's printed row,
    the rule stated and our own gain rows named as a different definition."""
    values = run_table()
    table = values.copy()
    for c in values.columns:
        table[f"{c} ci_low"], table[f"{c} ci_high"] = values[c], values[c]
    table["exposed_to_eval_strings"] = False
    md = paper.table3_as_published_markdown(table, {}, 2, model_roles(RUN_MODELS))
    lines = md.splitlines()
    ours = lines.index(next(s for s in lines if s.startswith("| Avg Accuracy Gain w.r.t. Loss Function (paper's")))
    assert lines[ours + 1].startswith("| paper: Avg Accuracy Gain w.r.t. Loss Function |")
    assert lines[ours].split(" | ")[1:4] == ["+6.5%", "+7.4%", "+5.0%"]
    assert lines[ours + 1].split(" | ")[1:4] == ["+6.5%", "+7.4%", "+5.0%"]
    assert "| paper: CLIP |" in md and "## Gain rows by the paper's rule" in md
    assert "truncated toward zero to one decimal" in md and "our gain rows in table3.md" in md
