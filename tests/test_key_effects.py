"""Which key moves which cell: `cglib compare-protocols` on two twin runs that were each ablated one key at a time
puts the twins' change and each key's change alone in either run side by side, all read as the key corrected minus
as published (an ablation of the corrected run has its sign turned)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from test_training_changes import KEY, known_shift, run_folder

from cglib.cli import main as cli_main
from cglib.evaluate.ablation import ABLATION_DIR, ablation_cells, write_ablation
from cglib.evaluate.bootstrap import Scores

REPO = Path(__file__).resolve().parent.parent
TARGETS, AUGMENT = "train.pretrain_targets", "train.augment"


def ablated_twins(tmp_path):
    """Twin runs of models a and b: a is better trained corrected (known_shift). In each run, flipping
    pretrain_targets alone retrains a to the other run's scores (that key is the whole change); flipping augment
    retrains a to the run's own scores (no change). b is never retrained (reused)."""
    metrics, corrected, published, base, better = known_shift(seeds=1)
    ours = run_folder(tmp_path, "demo", "corrected", corrected, metrics)
    theirs = run_folder(tmp_path, "demo_as_published", "as_published", published, metrics)
    units = corrected[KEY]["a"].units
    for folder, own, other_a in ((theirs, published, Scores(better[:, 10:], units[10:])),
                                 (ours, corrected, Scores(base, units))):
        flipped = {TARGETS: {KEY: {**own[KEY], "a": other_a}}, AUGMENT: own}
        cells = ablation_cells(metrics, own, flipped, {TARGETS: ["a"], AUGMENT: ["a"]}, ["a", "b"],
                               {TARGETS: ("x", "y"), AUGMENT: ("u", "v")}, 200, 0.95, 0)
        write_ablation(cells, folder / ABLATION_DIR, "")
    return ours, theirs, base, better


def test_each_keys_change_alone_reads_corrected_minus_as_published_in_both_twins(tmp_path):
    ours, theirs, base, better = ablated_twins(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["compare-protocols", str(ours), str(theirs)]) == 0
    effects = pd.read_csv(ours / "evaluation" / "key_effects.csv").set_index(["key", "source"])
    assert set(pd.read_csv(ours / "evaluation" / "key_effects.csv")["row"]) == {"a"}  # b: reused in both ablations
    twins = pd.read_csv(ours / "evaluation" / "training_changes.csv").set_index("model").loc["a"]
    assert effects.loc[("all keys (the twins)", "twins"), "change"] == pytest.approx(twins["change"])
    # correcting the targets alone in the as-published run: a gains what the twins differ by on its images
    alone_published = effects.loc[(TARGETS, "in_as_published")]
    assert alone_published["change"] == pytest.approx(100 * (better[:, 10:].mean() - base[:, 10:].mean()))
    # un-correcting them alone in the corrected run loses it: the sign is turned, the CI with it
    alone_corrected = effects.loc[(TARGETS, "in_corrected")]
    assert alone_corrected["change"] == pytest.approx(100 * (better.mean() - base.mean()))
    for cell in (alone_published, alone_corrected):
        assert 0 < cell["ci_low"] <= cell["change"] <= cell["ci_high"] and cell["significant"]
    for source in ("in_as_published", "in_corrected"):
        assert effects.loc[(AUGMENT, source), "change"] == 0 and not effects.loc[(AUGMENT, source), "significant"]
    md = (ours / "evaluation" / "key_effects.md").read_text()
    assert (f"| {TARGETS} | {alone_published['change']:+.1f}* / {alone_corrected['change']:+.1f}* |" in md
            and f"| {AUGMENT} | +0.0 / +0.0 |" in md and "which key moves which cell" in out.getvalue().lower())
    for suffix in ("png", "pdf"):
        assert (ours / "evaluation" / f"key_effects.{suffix}").stat().st_size > 1000
    assert cli_main(["figures", str(ours / "evaluation"), "--from-data", "--formats", "png"]) == 0


def test_without_an_ablation_the_comparison_says_how_to_add_the_table(tmp_path, capsys):
    metrics, corrected, published, _, _ = known_shift(seeds=1)
    ours = run_folder(tmp_path, "demo", "corrected", corrected, metrics)
    theirs = run_folder(tmp_path, "demo_as_published", "as_published", published, metrics)
    assert cli_main(["compare-protocols", str(ours), str(theirs)]) == 0
    assert "cglib ablate PARAMS --rows" in capsys.readouterr().out
    assert not (ours / "evaluation" / "key_effects.csv").exists()


def test_notebook_06_shows_the_key_effects_of_ablated_twins_beside_its_run(tmp_path):
    """Notebook 06's twin cell and its key-effects cell, run as written on a run whose twin sits beside it (both
    ablated): the table is displayed and the figure saved among the run's figures."""
    import nbformat
    from IPython.display import Markdown

    from cglib.config import load_params
    from cglib.viz.style import save_figure

    ours, _, _, _ = ablated_twins(tmp_path)
    cells = {c.get("id"): c.source for c in nbformat.read(REPO / "notebooks" / "06_evaluation.ipynb", 4).cells}
    shown = []
    run = SimpleNamespace(dir=ours, params=load_params(ours / "params.yaml", check_paths=False),
                          figures=ours / "figures")
    namespace = {"run": run, "Markdown": Markdown, "display": shown.append, "save_figure": save_figure}
    for cell in ("training-changes-41", "which-key-moves"):
        exec(compile(cells[cell], cell, "exec"), namespace)  # noqa: S102 (the repository's own notebook)
    assert [type(s).__name__ for s in shown] == ["Markdown", "Markdown"]
    assert shown[1].data.startswith("# Which key moves which cell") and f"| {TARGETS} |" in shown[1].data
    assert (ours / "figures" / "06_key_effects.png").stat().st_size > 1000
