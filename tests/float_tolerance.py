"""How far two float32 trainings that are equal in exact arithmetic may drift apart, on any x86 CPU.

The tests that compare 2 processes with 1 (gloo sums each rank's gradient; one process sums the whole batch in
one reduction) compare computations whose every gradient element differs by rounding only. How far the weights
then differ depends on the optimizer, and one property of AdamW decides whether any bound exists:

- AdamW's step is lr * m / (sqrt(v) + eps): its sensitivity to a gradient element g is at most lr / (|g| + eps).
  With the recipe's eps = 1e-6 and lr = 1e-3 a rounding difference in an element whose gradient is below eps is
  multiplied by up to 1e3 per step. The attention key bias is such an element: its exact gradient is zero (a bias
  shared by every key shifts each query's logits by one constant, which softmax ignores), so its float32
  gradient is pure rounding and its trajectory is that rounding amplified: 1.14e-5 apart after 78 steps at
  lr 1e-3 on AVX2 kernels (where a tolerance of 1e-5 failed), with nothing in float32's epsilon to bound it.
- With eps = ADAM_EPS (1.0) the sensitivity is at most lr, and the arithmetic below holds. The equality tests
  therefore train with it (`train.adam_eps` / `Stepper(eps=...)`): what they check (the gradients averaged over
  the ranks, the batch split, the data order, an objective's own state) does not depend on eps, and a wrong
  gradient scale (a sum where a mean belongs), invisible to an AdamW whose eps is negligible, now moves weights.

The bound, per element, after `steps` optimizer steps at peak learning rate `lr` with gradients clipped to a
norm of `grad_clip` (so every clipped element is at most grad_clip):
- each step's gradient element differs by rounding, |dg| <= EPS32 * grad_clip, which the step turns into at most
  lr * EPS32 * grad_clip;  over the steps: atol = steps * lr * EPS32 * grad_clip;
- each step rounds the updated weight to float32, at most one ulp apart, EPS32 * |w|;  over the steps:
  rtol = steps * EPS32.
It leaves out the growth of an early difference through later steps (their gradients depend on the weights);
the tests' measured noise (stated where each is used) stays a small fraction of the bound.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

EPS32 = torch.finfo(torch.float32).eps  # 1.19e-7
ADAM_EPS = 1.0  # bounds AdamW's amplification of a gradient's rounding by lr (see above)


def trained_tolerance(steps: int, lr: float, grad_clip: float = 1.0) -> dict[str, float]:
    """`torch.testing.assert_close` keywords for weights after `steps` AdamW steps (eps = ADAM_EPS) at peak `lr`."""
    return {"atol": steps * lr * EPS32 * grad_clip, "rtol": steps * EPS32}


def optimizer_steps(run_output: Path) -> int:
    """Every optimizer step a trained run took (textual pretraining and image-text), from its summary.json."""
    summary = json.loads((run_output / "summary.json").read_text(encoding="utf-8"))
    return summary["steps"] + (summary.get("pretrain_steps") or 0)
