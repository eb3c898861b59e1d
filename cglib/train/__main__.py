"""`python -m cglib.train PARAMS [--runs NAME ...]`: train runs of a params file; works under torchrun (DDP).

    python -m cglib.train params/paper.yaml --runs pairwise centroid
    torchrun --nproc_per_node 2 -m cglib.train params/paper.yaml --runs pairwise

Under torchrun write `--runs`: torchrun's own parser reads `--run` as an ambiguous abbreviation of its `--run-path`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

from cglib.config import load_params
from cglib.distributed import init_distributed
from cglib.prepare import prepare_inputs
from cglib.run import RETRAIN_CHANGED_ENV, RunContext, open_run, seed_everything, set_threads
from cglib.train.faults import Terminated
from cglib.train.loop import train_all


@record  # under torchrun, a rank's exception (its message and traceback) is in torchrun's failure summary
def main(argv: list[str] | None = None) -> int:
    """Parse arguments, join the process group (under torchrun), train, print the summaries' key figures."""
    parser = argparse.ArgumentParser(prog="python -m cglib.train", description=__doc__.splitlines()[0])
    parser.add_argument("params", type=Path, help="params YAML file (e.g. params/demo.yaml)")
    parser.add_argument("--runs", "--run", action="extend", nargs="+", dest="runs", metavar="NAME",
                        help="train.runs names (repeatable); default: every run")
    parser.add_argument("--run-dir", type=Path, default=None, help="run directory (default outputs/<run.name>)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (batch jobs)")
    parser.add_argument("--retrain-changed", action="store_true",
                        help="train again the runs (and bases) that other library code trained; by default they are "
                        "reused and named on the terminal")
    args = parser.parse_args(argv)
    if args.retrain_changed:  # read where reuse is decided; inherited by torchrun's children
        os.environ[RETRAIN_CHANGED_ENV] = "1"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    if int(os.environ.get("RANK", "0")) == 0:
        run = open_run(args.params, args.run_dir)
    else:  # other ranks read the same params without rewriting the run folder's params.yaml
        params = load_params(args.params)
        run = RunContext(params=params, dir=args.run_dir or params.run_dir(), params_path=args.params)
        seed_everything(params.run.seed)
        set_threads(params.run.threads)
    info = init_distributed(run.device())
    try:
        prepared = prepare_inputs(run, args.runs, progress=not args.no_progress, info=info)
        summaries = train_all(run, prepared, args.runs, progress=not args.no_progress, info=info)
    except Terminated:  # SIGTERM: the run saved its checkpoint; the same command resumes it
        return 128 + 15
    if info.is_main:
        for name, s in summaries.items():
            print(json.dumps({"run": name, "steps": s["steps"], "final_loss": s["final_loss"],
                              "images_per_s": s["images_per_s"], "wall_time_s": s["wall_time_s"]}))
    if info.distributed:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
