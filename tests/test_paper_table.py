"""The paper beside us (issue #32 item 4): its Table 3 and gain rows as printed, and which gains our definitions
reproduce from the paper's own table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from cglib.evaluate import paper
from cglib.evaluate.gains import GAINS


def test_the_paper_table_holds_all_eight_rows_as_printed():
    """Eight model rows and four gain rows over the ten columns; spot checks against the paper's numbers."""
    assert paper.PAPER_TABLE3.shape == (8, 10) and paper.PAPER_GAINS.shape == (4, 10)
    assert list(paper.PAPER_GAINS.index) == list(GAINS)
    assert set(paper.PAPER_ROLES) == set(paper.PAPER_TABLE3.index)
    assert paper.PAPER_TABLE3.loc["HierarCaps fine-tuned", "HierarCaps l4"] == 78.6
    assert paper.PAPER_TABLE3.loc["centroid + pretraining", "COCO"] == 88.1
    assert paper.PAPER_GAINS.loc["Pretraining", "MAGIC captions"] == 6.9


def test_our_definitions_reproduce_the_magic_gain_and_no_other():
    """Our MAGIC gain (relative gain of the set means: six fine-tuned rows over CLIP and HierarCaps) is the
    printed row within rounding; Loss Function, Pretraining and Best Model are not (Pretraining at MAGIC
    captions: 3.8% computed against 6.9% printed)."""
    check = paper.paper_gain_check()
    assert check["reproduced"].to_dict() == {"MAGIC": True, "Loss Function": False, "Pretraining": False,
                                             "Best Model": False}
    assert check.loc["MAGIC", "ours_max_error"] <= paper.TOLERANCE
    ours = paper.paper_gains_by_our_definitions()
    # by hand: pretraining (77.4 + 77.2) / 2 over the same objectives without it (74.1 + 74.8) / 2
    assert ours.loc["Pretraining", "MAGIC captions"] == pytest.approx(100 * (77.3 / 74.45 - 1))
    assert round(ours.loc["Pretraining", "MAGIC captions"], 1) == 3.8
    # the best row is the one with the highest mean over the ten columns: CLEAR GLASS pairwise
    assert ours.loc["Best Model", "COCO"] == pytest.approx(100 * (96.2 / 96.6 - 1))


def test_the_measures_equal_their_literal_definitions():
    """relative, points and relative_pairs against loops over the rows."""
    x = paper.PAPER_TABLE3.to_numpy(float)
    a, b = [1, 4, 6], [0, 2]
    mask_a, mask_b = np.isin(np.arange(8), a)[None].astype(float), np.isin(np.arange(8), b)[None].astype(float)
    mean_a, mean_b = x[a].mean(0), x[b].mean(0)
    assert np.allclose(paper._gains(x, mask_a, mask_b, "relative")[0], 100 * (mean_a / mean_b - 1))
    assert np.allclose(paper._gains(x, mask_a, mask_b, "points")[0], mean_a - mean_b)
    pairs = np.mean([x[i] / x[j] - 1 for i in a for j in b], axis=0)
    assert np.allclose(paper._gains(x, mask_a, mask_b, "relative_pairs")[0], 100 * pairs)


def test_the_search_finds_a_planted_definition():
    """A gain row made by a known definition (points of CLIP fine-tuned over CLIP) is found, every column of it."""
    t = paper.PAPER_TABLE3
    planted = pd.DataFrame([(t.loc["CLIP fine-tuned"] - t.loc["CLIP"]).round(1)], index=["planted"])
    found = paper.gain_definition_search(printed=planted).loc["planted"]
    assert found["columns_reproduced"] == 10 and found["measure"] == "points"
    assert (found["models_a"], found["models_b"]) == ("CLIP fine-tuned", "CLIP")


def test_no_split_of_the_rows_reproduces_the_other_printed_gains():
    """The closest definition found for Loss Function, Pretraining and Best Model still misses a column (what the
    README and notebook 06 say); for MAGIC it is ours."""
    search = paper.gain_definition_search()
    assert search.loc["MAGIC", "columns_reproduced"] == 10
    assert search.loc["MAGIC", "models_b"] == "CLIP; HierarCaps"
    for gain in ("Loss Function", "Pretraining", "Best Model"):
        assert search.loc[gain, "columns_reproduced"] < 10, gain
    table = paper.paper_beside_ours()
    assert table.shape == (8, 10) and table.index[0] == ("printed", "MAGIC")
