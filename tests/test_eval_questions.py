"""Notebook 06's questions answered from the gain rows: the verdict, the numbers and Holm's significance come
from the results, and the gains figure draws one panel per gain with the legend outside the data."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pandas as pd
import pytest

from cglib.evaluate.gains import GAIN_COLUMNS
from cglib.evaluate.questions import QUESTIONS, answer, answers
from cglib.viz.compare import plot_gains

COLUMNS = ["MAGIC captions", "MAGIC l1", "MAGIC l2"]


def gain_rows(gain: str, cells: list[tuple[float, float, float, bool]], a: str = "pairwise",
              b: str = "clip") -> list[dict]:
    return [{"gain": gain, "column": c, "models_a": a, "models_b": b, "difference": d, "ci_low": lo,
             "ci_high": hi, "p_value": 0.001 if sig else 0.4, "significant": sig}
            for c, (d, lo, hi, sig) in zip(COLUMNS, cells)]


def toy_gains() -> pd.DataFrame:
    rows = (gain_rows("MAGIC", [(4.0, 2.0, 6.0, True), (3.0, 1.0, 5.0, True), (1.0, -1.0, 3.0, False)],
                      "clip;pairwise", "zero-shot")
            + gain_rows("Loss Function", [(-3.0, -5.0, -1.0, True), (2.5, 0.5, 4.5, True), (0.0, -2.0, 2.0, False)])
            + gain_rows("Pretraining", [(0.5, -1.0, 2.0, False)] * 3, "pairwise_pretrain", "pairwise"))
    return pd.DataFrame(rows).reindex(columns=GAIN_COLUMNS)


def test_answers_state_verdict_numbers_and_significance():
    """Up at two columns only: Yes, with the mean and the largest gain and its CI; up and down: Mixed, naming both;
    nothing significant: no evidence either way; a gain absent from the run: not answerable."""
    gains = toy_gains()
    magic = answer(gains, "MAGIC")
    assert magic.startswith("Does fine-tuning on MAGIC help? Yes. Over the 3 Table 3 columns the difference "
                            "averages +2.7 points (largest +4.0 [2.0, 6.0] at MAGIC captions)")
    assert "up at MAGIC captions, MAGIC l1 and down at no column" in magic and "(clip, pairwise vs zero-shot)" in magic
    loss = answer(gains, "Loss Function")
    assert " Mixed. " in loss and "up at MAGIC l1 and down at MAGIC captions" in loss
    assert "No evidence either way" in answer(gains, "Pretraining") and "no column survives" in answer(gains,
                                                                                                         "Pretraining")
    assert answer(gains, "Best Model").endswith("Not answerable in this run: it lacks the models on one side "
                                                "(see the gain notes).")
    assert len(answers(gains)) == len(QUESTIONS) == 4


def test_gains_figure_has_a_panel_per_gain_and_fills_the_significant_cells():
    """Three gains: three panels titled by their questions, columns in Table 3's order top to bottom, filled dots
    exactly at the significant cells, the legend outside every panel; no gain at all is a clear error."""
    gains = toy_gains()
    fig = plot_gains(gains, QUESTIONS)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title().replace("\n", " ") for ax in panels] == [QUESTIONS[g] for g in
                                                                     ("MAGIC", "Loss Function", "Pretraining")]
    assert [t.get_text() for t in panels[0].get_yticklabels()] == list(reversed(COLUMNS))
    filled = [sum(matplotlib.colors.to_rgba(line.get_markerfacecolor()) != (1, 1, 1, 1)
                  for line in ax.get_lines() if line.get_marker() == "o") for ax in panels]
    assert filled == [2, 2, 0]
    fig.canvas.draw()
    legend = fig.legends[0].get_window_extent()
    assert all(not legend.overlaps(ax.get_window_extent()) for ax in panels)
    with pytest.raises(ValueError, match="no gain row"):
        plot_gains(gains.iloc[:0])


def test_the_toy_geometry_takeaways_are_read_off_the_table():
    """Notebook 04's takeaway: spread and separation as factors of their start, the direction in words, the pair
    cosine before and after, one sentence per loss, from the geometry table."""
    from cglib.viz.dual_effect import geometry_takeaways

    geometry = pd.DataFrame({"within_group_spread_before": [0.6, 0.6], "within_group_spread_after": [0.9, 0.3],
                             "separation_before": [2.0, 2.0], "separation_after": [3.0, 19.0],
                             "pair_cosine_before": [0.58, 0.58], "pair_cosine_after": [1.0, 0.82]},
                            index=pd.Index(["clip", "centroid"], name="loss"))
    assert geometry_takeaways(geometry) == [
        ("clip: within-group spread x1.50 (looser groups), separation x1.50 (group means further apart relative to "
        "the spread), image-text pair cosine 0.58 -> 1.00."),
        ("centroid: within-group spread x0.50 (tighter groups), separation x9.50 (group means further apart relative "
        "to the spread), image-text pair cosine 0.58 -> 0.82.")]
