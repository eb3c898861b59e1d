"""A run folder for trying new objectives beside a run's trained rows, on the same data (notebook 09).

`trial_run(run, [{"name": "mine", "loss": "my_module:MyObjective"}], beside=["clip", "centroid"])` makes
`<run>/own_objective/`: it shares the run's captions, MAGIC and image cache (links), copies the base weights
and the named rows' trained outputs of the first training seed (their spec is unchanged, so `train_all` reuses
them instead of training again), and its params list those rows and yours under that one training seed.
Evaluating it (`evaluate_run`) scores every row on the run's own test items.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from cglib.config import Params
from cglib.run import RunContext, training_dir
from cglib.train.checkpoint import FINAL, INITIAL

SHARED = ("captions", "magic", "cache")  # inputs the trial reads as they are: linked, never copied
TRIAL_FOLDER = "own_objective"


def trial_run(run: RunContext, runs: list[dict[str, Any]], beside: list[str], folder: str = TRIAL_FOLDER
              ) -> RunContext:
    """The trial's RunContext (see the module docstring); `runs` are train.runs entries, `beside` names of
    entries of the run's train.runs (trained by notebook 05) to compare with."""
    known = {r.name: r for r in run.params.train.runs}
    missing = [name for name in beside if name not in known]
    if missing:
        raise ValueError(f"beside names {missing}, which are not train.runs entries of this run; choose among "
                         f"{list(known)}")
    clash = [r["name"] for r in runs if r["name"] in beside]
    if clash:
        raise ValueError(f"run names {clash} are already taken by the rows beside them; rename your runs")
    seed = run.params.train.seeds[0]
    data = run.params.model_dump(mode="json")
    data["train"].update(runs=[known[name].model_dump(mode="json", exclude_defaults=True) for name in beside] + runs,
                         seeds=[seed])
    data["run"]["name"] = f"{run.params.run.name}-{folder}"
    data["search"]["run"] = None
    params = Params.model_validate(data)
    directory = run.dir / folder
    directory.mkdir(parents=True, exist_ok=True)
    for name in SHARED:
        _link(run.dir / name, directory / name)
    source, target = training_dir(run.dir, seed), training_dir(directory, seed)
    target.mkdir(parents=True, exist_ok=True)
    for file in (INITIAL, INITIAL.replace(".safetensors", ".json")):
        if (source / file).is_file() and not (target / file).is_file():
            shutil.copy2(source / file, target / file)
    for name in beside:
        if (source / name / FINAL).is_file() and not (target / name / FINAL).is_file():
            shutil.copytree(source / name, target / name, dirs_exist_ok=True)
    return RunContext(params=params, dir=directory, params_path=run.params_path)


def _link(source: Path, link: Path) -> None:
    """`link` -> `source` (an existing link to elsewhere is replaced; a missing source is an error naming the
    notebook that writes it)."""
    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist: run notebooks 01-05 for this run first")
    if link.is_symlink() and link.resolve() != source.resolve():
        link.unlink()
    if not link.exists():
        link.symlink_to(source.resolve(), target_is_directory=True)
