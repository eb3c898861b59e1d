"""The classroom profile's whole series (`cglib run params/classroom.yaml`) against `python -c "import torch"`,
each a fresh process tree, measured in the same run.

    python benchmarks/bench_classroom.py [--baseline-runs 3] [--params params/classroom.yaml] [--numba-cache DIR]

Prints, for the run and the baseline, the wall time and the CPU time (user + system of the whole process tree: the
runner and every notebook's kernel), their ratios, and per notebook: wall, CPU, the time inside its cells and the
time outside them (kernel start-up, papermill's reading and writing of the notebook). On a machine shared with
other jobs the wall time grows with their load and the CPU time much less; the profile's target, 3 minutes of wall
time on a 2-core laptop, is for an idle machine. By default the UMAP's numba code is compiled into a fresh cache, as
on a teacher's first run; --numba-cache names a warm one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one command and every process it started (it must succeed)."""
    cpu0, start = children_cpu(), time.perf_counter()
    subprocess.run(command, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start, children_cpu() - cpu0


def cell_seconds(notebook: Path) -> float:
    """Seconds spent inside the cells of an executed notebook (papermill's per-cell durations)."""
    cells = json.loads(notebook.read_text())["cells"]
    return sum(c.get("metadata", {}).get("papermill", {}).get("duration") or 0 for c in cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params/classroom.yaml")
    parser.add_argument("--baseline-runs", type=int, default=3)
    parser.add_argument("--numba-cache", help="numba cache folder (default: a fresh one, as on a first run)")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg"}
    baseline = [sys.executable, "-c", "import torch"]
    with tempfile.TemporaryDirectory(prefix="bench-classroom-") as tmp:
        env["NUMBA_CACHE_DIR"] = args.numba_cache or str(Path(tmp) / "numba")
        run_dir = Path(tmp) / "run"
        measure(baseline, env)  # once before timing: the first import pays for reading torch from disk
        base = [measure(baseline, env) for _ in range(args.baseline_runs // 2 + 1)]
        wall, cpu = measure([sys.executable, "-m", "cglib.cli", "run", args.params, "--out", str(run_dir)], env)
        base += [measure(baseline, env) for _ in range(args.baseline_runs - len(base))]  # after too: the load moves
        manifest = json.loads((run_dir / "run.json").read_text())
        rows = [(n["name"], n["duration_s"], n.get("cpu_s") or 0.0, cell_seconds(Path(n["output"])))
                for n in manifest["notebooks"]]
    base_wall, base_cpu = statistics.median(w for w, _ in base), statistics.median(c for _, c in base)
    print(f"{'notebook':24s} {'wall s':>7s} {'CPU s':>7s} {'in cells':>9s} {'outside':>8s}")
    for name, nb_wall, nb_cpu, cells in rows:
        print(f"{name:24s} {nb_wall:7.1f} {nb_cpu:7.1f} {cells:9.1f} {nb_wall - cells:8.1f}")
    print(f"{'notebooks':24s} {sum(r[1] for r in rows):7.1f} {sum(r[2] for r in rows):7.1f} "
          f"{sum(r[3] for r in rows):9.1f} {sum(r[1] - r[3] for r in rows):8.1f}")
    print(f"cglib run {args.params}: wall {wall:.1f} s, CPU {cpu:.1f} s (user + system, whole process tree)")
    print(f"python -c 'import torch': wall {base_wall:.2f} s, CPU {base_cpu:.2f} s (median of {len(base)})")
    print(f"ratio: wall {wall / base_wall:.0f}x, CPU {cpu / base_cpu:.0f}x python -c 'import torch'; "
          f"load average at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
