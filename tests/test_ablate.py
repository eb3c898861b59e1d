"""One protocol key at a time (`cglib ablate`): a flip changes only its key's spec, the rows it leaves unchanged are
the run's own (linked, never written), the rows it changes are trained for real in the flipped folder, and every
cell is scored against the run's own row with Holm's correction over the tested cells."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import snapshot
from prepared_runs import train_all_prepared
from test_eval_pipeline import make_run
from test_training_changes import known_shift

from cglib.ablate import flipped_run, plan_ablation
from cglib.cli import main as cli_main
from cglib.config import load_params
from cglib.config.protocol import DIFFERENCES, OPTION_PREFIX
from cglib.evaluate import evaluate_run
from cglib.evaluate.ablation import ablation_cells
from cglib.evaluate.multiplicity import holm
from cglib.evaluate.table3 import table3_columns
from cglib.prepare.base import initial_is_current, initial_spec
from cglib.run import RunContext, save_params, write_json
from cglib.train.checkpoint import INITIAL
from cglib.train.inputs import run_entry, run_spec

REPO = Path(__file__).resolve().parent.parent
DEMO_ROWS = ["clip", "pairwise_pretrain", "centroid_pretrain", "hierarcaps_ft"]
ROWS = ["clip", "pairwise_pretrain"]
KEYS = ["train.pretrain_targets", OPTION_PREFIX + "logit_scale"]


def flat(tree, prefix=""):
    out = {}
    for key, value in tree.items():
        out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def spec_paths(key: str) -> set[str]:
    """Where a protocol key shows in a run's spec: an option in the entry's options, pretrain_targets through the
    entries' resolved `pretrain`, any other key as itself and in an option of its name that the objective fills
    from the train section (a group loss's tau_inner)."""
    if key.startswith(OPTION_PREFIX):
        return {"run.options." + key[len(OPTION_PREFIX):]}
    return {"run.pretrain"} if key == "train.pretrain_targets" else {key, "run.options." + key.split(".")[-1]}


def test_one_key_flipped_changes_that_key_alone_in_every_rows_spec():
    """On the demo, every protocol key that changes a named row (the file's own keys too, named explicitly):
    between each row's spec in the run and with the key flipped, exactly that key's place differs (in the row or
    in the run its init names) for the rows the plan trains, and nothing for the rows it reuses."""
    params = REPO / "params" / "demo.yaml"
    default = plan_ablation(params, DEMO_ROWS)
    assert "magic.generalize" in default.skipped  # acts before training: no row's spec
    assert {"train.weight_decay", "train.epoch"} <= set(default.skipped)  # the demo sets them itself
    keys = [d.key for d in DIFFERENCES if d.key != "magic.generalize"]
    plan = plan_ablation(params, DEMO_ROWS, keys)
    assert [f.key for f in plan.flips] == keys and not plan.skipped
    original = load_params(params)
    for flip in plan.flips:
        for name in flip.changed + flip.reused:
            before = flat(json.loads(json.dumps(run_spec(original, run_entry(original, name)), default=str)))
            after = flat(json.loads(json.dumps(run_spec(flip.params, run_entry(flip.params, name)), default=str)))
            differ = {k.removeprefix("init.") for k in set(before) | set(after) if before.get(k) != after.get(k)}
            if name in flip.changed:
                assert differ and differ <= spec_paths(flip.key), (flip.key, name, differ)
            else:
                assert not differ, (flip.key, name, differ)
    targets = next(f for f in plan.flips if f.key == "train.pretrain_targets")
    assert targets.changed == ["pairwise_pretrain", "centroid_pretrain"]  # clip and the HierarCaps rows: reused
    assert plan.trainings == sum(len(f.changed) for f in plan.flips) * 3  # the demo's three training seeds


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A tiny run (tiny_magic, the tiny ViT, one training seed) trained and evaluated: clip and a pretrained
    pairwise row."""
    root = tmp_path_factory.mktemp("ablate")
    run = make_run(root, runs=[{"name": "clip", "loss": "clip"},
                               {"name": "pairwise_pretrain", "loss": "pairwise", "pretrain": True}], seeds=[0])
    train_all_prepared(run, progress=False)
    evaluate_run(run, progress=False)
    return root / "params" / "tiny.yaml", run.dir


@pytest.fixture(scope="module")
def ablated(finished_run):
    """`cglib ablate` on the finished run with two keys, twice: the exit codes, the outputs, the run's training and
    evaluation files before and after, and the flipped rows' files after each call."""
    params, run_dir = finished_run
    before = {part: snapshot(run_dir / part) for part in ("training", "evaluation")}
    codes, outs, flipped = [], [], []
    for _ in range(2):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            codes.append(cli_main(["ablate", str(params), "--rows", ",".join(ROWS), "--keys", ",".join(KEYS),
                                   "--run-dir", str(run_dir), "--quiet"]))
        outs.append(out.getvalue())
        flipped.append(snapshot(run_dir / "ablation"))
    after = {part: snapshot(run_dir / part) for part in ("training", "evaluation")}
    return codes, outs, before, after, flipped


def test_the_flipped_rows_train_the_others_are_reused_and_the_run_is_untouched(finished_run, ablated):
    """Flipping pretrain_targets retrains the pretrained row alone, flipping the CLIP baseline's logit_scale the
    clip row alone: two trainings, two reused rows (links to the run's weights), and not one byte of the run's
    own training or evaluation files changes."""
    _, run_dir = finished_run
    codes, (out, again), before, after, flipped = ablated
    assert codes == [0, 0], out + again
    assert "2 row trainings" in out and "2 reused from the run" in out and "(2 by this call)" in out
    assert before == after
    # a second call finds every flipped row trained: it trains nothing and leaves their weights as they were
    assert "(0 by this call)" in again
    assert "0 of them trained by this call" in (run_dir / "ablation" / "ablation.md").read_text()
    weights = [k for k in flipped[0] if k.endswith("final.safetensors")]
    assert len(weights) == 4 and all(flipped[0][k] == flipped[1][k] for k in weights)
    targets = run_dir / "ablation" / "train.pretrain_targets" / "training"
    scale = run_dir / "ablation" / "train.runs.options.logit_scale" / "training"
    for trained, reused in ((targets / "pairwise_pretrain", targets / "clip"),
                            (scale / "clip", scale / "pairwise_pretrain")):
        assert (reused / "final.safetensors").is_symlink()
        assert (reused / "final.safetensors").resolve() == (run_dir / "training" / reused.name / "final.safetensors")
        assert (trained / "final.safetensors").is_file() and not (trained / "final.safetensors").is_symlink()
        assert not any(p.is_symlink() for p in trained.rglob("*"))
    assert json.loads((targets / "pairwise_pretrain" / "summary.json").read_text())["pretrain"] == "with_concepts"
    clip = json.loads((scale / "clip" / "summary.json").read_text())
    assert clip["spec"]["run"]["options"]["logit_scale"] == "learned"
    assert (targets / "initial.safetensors").is_symlink()  # the run's base


def test_the_table_has_every_key_row_and_column_with_holm_over_the_tested_cells(finished_run, ablated):
    """ablation.csv: one line per key x row x Table 3 column; the reused cells are no test; p_holm is Holm over
    the trained cells; ablation.md has one line per key and row panel; the figure exists as PNG and PDF, and is
    redrawn from its data alone like every figure."""
    _, run_dir = finished_run
    cells = pd.read_csv(run_dir / "ablation" / "ablation.csv")
    metrics = pd.read_csv(run_dir / "evaluation" / "metrics.csv", dtype={"level": str})
    columns = [c.header for c in table3_columns(metrics)]
    assert len(cells) == len(KEYS) * len(ROWS) * len(columns)
    assert set(map(tuple, cells[["key", "row"]].drop_duplicates().to_numpy())) == {(k, r) for k in KEYS for r in ROWS}
    trained = cells[cells["trained"]]
    assert set(map(tuple, trained[["key", "row"]].drop_duplicates().to_numpy())) == {
        ("train.pretrain_targets", "pairwise_pretrain"), (OPTION_PREFIX + "logit_scale", "clip")}
    assert cells.loc[~cells["trained"], "p_value"].isna().all() and (cells.loc[~cells["trained"], "change"] == 0).all()
    np.testing.assert_allclose(trained["p_holm"], holm(trained["p_value"].to_numpy(float)))
    assert (trained["change"] - (trained["flipped"] - trained["run"])).abs().max() < 1e-9
    scored = trained[trained["images"] > 0]  # tiny_magic's l2 items are all excluded (siblings as negatives)
    assert len(scored) >= 2 * 4 and scored["p_value"].notna().all()
    assert ((scored["ci_low"] <= scored["change"] + 1e-9) & (scored["change"] <= scored["ci_high"] + 1e-9)).all()
    md = (run_dir / "ablation" / "ablation.md").read_text()
    assert "## clip" in md and "## pairwise_pretrain" in md and "Row trainings: 2 = 2 keys x 2 rows" in md
    assert "| train.pretrain_targets | = (reused)" in md  # clip's line
    assert f"all {int(trained['p_value'].notna().sum())} tested cells" in md
    for key, row in (("train.pretrain_targets", "pairwise_pretrain"), (OPTION_PREFIX + "logit_scale", "clip")):
        # the flipped cell's two sides are the flipped run's and the run's own evaluation of that row
        folder = run_dir / "ablation" / key.replace("[]", "")
        theirs = pd.read_csv(folder / "evaluation" / "metrics.csv", dtype={"level": str})
        for side, table in (("flipped", theirs), ("run", metrics)):
            value = table.query("model == @row and benchmark == 'forced_choice' and labels == 'dag' and "
                                "direction == 't2i' and metric == 'accuracy' and level == 'caption'")["value"]
            cell = cells.query("key == @key and row == @row and column == 'COCO'")[side]
            assert float(cell.iloc[0]) == pytest.approx(100 * float(value.iloc[0]))
        trained_weights = (folder / "training" / row / "final.safetensors").read_bytes()
        assert trained_weights != (run_dir / "training" / row / "final.safetensors").read_bytes()
    for suffix in ("png", "pdf"):
        assert (run_dir / "figures" / f"ablation.{suffix}").stat().st_size > 1000
    assert cli_main(["figures", str(run_dir), "--from-data", "--formats", "png"]) == 0  # its data redraw it


def test_cells_find_a_known_change_and_leave_the_reused_rows_out_of_holms_family():
    """Key k1 retrains model a, which gets a fifth of the items right that the run's a gets wrong, and leaves b the
    run's; key k2 retrains both, to the same scores: one significant cell, two tested zeros, one untested row."""
    metrics, better, own, base, improved = known_shift()
    cells = ablation_cells(metrics, own, {"k1": better, "k2": own}, {"k1": ["a"], "k2": ["a", "b"]}, ["a", "b"],
                           {"k1": (1, 2), "k2": ("x", "y")}, 500, 0.95, 0).set_index(["key", "row"])
    assert cells.loc[("k1", "a"), "change"] == pytest.approx(100 * (improved[:, 10:].mean() - base[:, 10:].mean()))
    assert cells.loc[("k1", "a"), "significant"] and cells.loc[("k1", "a"), "images"] == 390
    assert not cells.loc[("k1", "b"), "trained"] and np.isnan(cells.loc[("k1", "b"), "p_value"])
    assert (cells.loc[[("k2", "a"), ("k2", "b")], "change"] == 0).all()
    assert not cells.loc[[("k2", "a"), ("k2", "b")], "significant"].any()
    tested = cells["p_value"].notna()
    assert tested.sum() == 3
    np.testing.assert_allclose(cells.loc[tested, "p_holm"], holm(cells.loc[tested, "p_value"].to_numpy(float)))
    assert (cells.loc[("k1", "b"), "from_value"], cells.loc[("k2", "a"), "to_value"]) == ("1", "y")


def test_a_flip_of_a_key_the_base_reads_keeps_the_runs_base(tmp_path):
    """The demo trains its base here, and its spec reads train.weight_decay: the flipped folder records the run's
    base as its own for the flipped spec (so training reuses it instead of training another base), links its
    weights, names where it came from and leaves the run's record as it was."""
    params = REPO / "params" / "demo.yaml"
    flip = plan_ablation(params, ["clip"], ["train.weight_decay"]).flips[0]
    run = RunContext(load_params(params), tmp_path / "demo", params)
    save_params(run.params, run.dir / "params.yaml")
    (run.training_dir / INITIAL).write_bytes(b"the base's weights")
    record = {"spec": initial_spec(run), "provenance": {"cglib_source": "another"}}
    write_json((run.training_dir / INITIAL).with_suffix(".json"), record)
    flipped = flipped_run(run, flip, [0])
    assert flipped.dir == run.dir / "ablation" / "train.weight_decay"
    assert initial_spec(flipped) != initial_spec(run) and initial_is_current(flipped)
    kept = json.loads((flipped.training_dir / INITIAL).with_suffix(".json").read_text())
    assert kept["kept_from"] == {"run": str(run.dir), "spec": record["spec"]}
    assert kept["provenance"] == record["provenance"]  # reused as the run's base is: by the code that made it
    assert (flipped.training_dir / INITIAL).resolve() == run.training_dir / INITIAL
    assert json.loads((run.training_dir / INITIAL).with_suffix(".json").read_text()) == record
    assert flipped.params.train.weight_decay == flip.to_value != run.params.train.weight_decay


def test_a_run_trained_by_other_code_is_named_beside_its_cells(tmp_path):
    """The flipped rows are trained by this code; a run's row trained by other library code makes a note naming
    that code and the command that trains the run again, and a row trained by this code none."""
    from cglib.ablate import other_code_notes
    from cglib.run import provenance

    params = REPO / "params" / "demo.yaml"
    plan = plan_ablation(params, ["clip", "pairwise"], ["train.tau_inner"])
    run = RunContext(load_params(params), tmp_path / "demo", params)
    for name, made in (("clip", {"git_commit": "1d39b0e2f0aa77", "cglib_source": "other"}), ("pairwise", provenance())):
        for k in plan.seeds:
            write_json(run.for_training_seed(k).training_dir / name / "summary.json", {"provenance": made})
    notes = other_code_notes(run, plan)
    assert len(notes) == 1 and "row 'clip'" in notes[0] and "cglib 1d39b0e2f0aa" in notes[0]
    assert f"cglib run {params} --from 05 --retrain-changed" in notes[0]


def test_weights_saved_where_a_link_stands_replace_the_link_not_the_file_it_names(tmp_path):
    """A flipped folder's files are links to the run's: saving weights there (a base or a row trained again) makes a
    file of the folder's own and leaves the run's weights as they were."""
    import torch

    from cglib.weights import save_weights

    theirs = tmp_path / "run" / "final.safetensors"
    save_weights(torch.nn.Linear(2, 2), theirs)
    before = theirs.read_bytes()
    mine = tmp_path / "flipped" / "final.safetensors"
    mine.parent.mkdir()
    mine.symlink_to(theirs)
    save_weights(torch.nn.Linear(3, 3), mine)
    assert not mine.is_symlink() and mine.read_bytes() != before and theirs.read_bytes() == before


def test_bad_keys_unknown_rows_and_unfinished_runs_exit_2_naming_the_fix(finished_run, tmp_path, capsys):
    params, run_dir = finished_run
    args = ["ablate", str(params), "--run-dir", str(run_dir)]
    assert cli_main([*args, "--rows", "clip", "--keys", "train.nothing"]) == 2
    err = capsys.readouterr().err
    assert "train.nothing: not a protocol key; choose among magic.generalize, train.weight_decay" in err
    assert cli_main([*args, "--rows", "clip,nope"]) == 2
    assert "no run named 'nope' in train.runs; choose one of ['clip', 'pairwise_pretrain']" in capsys.readouterr().err
    assert cli_main([*args, "--rows", "clip", "--keys", "train.pretrain_targets"]) == 2
    assert "changes the spec of none of clip" in capsys.readouterr().err
    fresh = make_run(tmp_path, runs=[{"name": "clip", "loss": "clip"}])  # MAGIC, no training
    assert cli_main(["ablate", str(fresh.params_path), "--rows", "clip", "--dry-run"]) == 0  # no run needed
    assert "row trainings (" in capsys.readouterr().out
    assert cli_main(["ablate", str(fresh.params_path), "--rows", "clip", "--run-dir", str(fresh.dir)]) == 2
    err = capsys.readouterr().err
    assert "the run is not trained; run `cglib run" in err and str(fresh.params_path) in err
