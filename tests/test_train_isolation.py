"""A run's final weights depend on its spec alone, not on what trained before it in the same process.

The demo's `hierarcaps` run (loss: re on a frozen MiniLM, projection trained) once came out with another hash when
other runs had trained first: their text tables had filled the process's MiniLM memo with outputs computed in
other batches, which differ in the last float32 digit (cglib.encoding now computes each text in a call of one
shape, so its outputs are the same whoever asks first).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import torch
from prepared_runs import train_one_prepared
from safetensors.torch import load_file
from test_train_text_projection import RE_OPTIONS, make_run

from cglib.train.checkpoint import FINAL

# clip on the original captions embeds most of the RE run's texts first, in its own text table
RUNS = [{"name": "clip", "loss": "clip", "text_source": "original"},
        {"name": "hierarcaps", "loss": "re", "options": RE_OPTIONS}]
ALONE = """
import sys
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_train_isolation import RUNS, weights_sha256
from test_train_text_projection import make_run
from prepared_runs import train_one_prepared
run = make_run(Path({directory!r}), RUNS)
train_one_prepared(run, "hierarcaps", progress=False)
print(weights_sha256(run.dir, "hierarcaps"))
"""


def weights_sha256(run_dir: Path, name: str) -> str:
    """sha256 over the final weights' tensors (names, shapes and bytes; the file's metadata left out)."""
    digest = hashlib.sha256()
    for key, tensor in sorted(load_file(str(Path(run_dir) / "training" / name / FINAL)).items()):
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def test_re_weights_do_not_depend_on_the_run_trained_before(tmp_path):
    after = make_run(tmp_path / "after", RUNS)
    train_one_prepared(after, "clip", progress=False)
    train_one_prepared(after, "hierarcaps", progress=False)
    script = ALONE.format(tests=str(Path(__file__).parent), directory=str(tmp_path / "alone"))
    alone = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert alone.stdout.split()[-1] == weights_sha256(after.dir, "hierarcaps")
