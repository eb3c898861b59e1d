"""`cglib validate params/demo.yaml` against `python -c pass`, each a fresh interpreter, measured in the same run.

    python benchmarks/bench_validate.py [--runs 7] [--params params/demo.yaml]

Prints the median wall time of each (of --runs runs, alternated) and their ratio; the validation imports neither
torch nor open_clip, so what it adds to the interpreter's start is pydantic, PyYAML and the params schema.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def wall(command: list[str]) -> float:
    """Seconds one command takes, start to exit (it must succeed)."""
    start = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--params", default="params/demo.yaml")
    args = parser.parse_args()
    baseline = [sys.executable, "-c", "pass"]
    validate = [sys.executable, "-m", "cglib.cli", "validate", args.params]
    wall(validate)  # once before timing: the first run pays for reading the files from disk
    times: dict[str, list[float]] = {"python -c pass": [], "cglib validate": []}
    for _ in range(args.runs):  # alternated, so a busy moment of the machine weighs on both
        times["python -c pass"].append(wall(baseline))
        times["cglib validate"].append(wall(validate))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, median in medians.items():
        print(f"{name:16s} median {median:.3f} s over {args.runs} runs")
    print(f"cglib validate {args.params}: {medians['cglib validate'] / medians['python -c pass']:.1f}x python -c pass")


if __name__ == "__main__":
    main()
