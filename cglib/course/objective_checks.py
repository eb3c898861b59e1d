"""Checks of notebook 09's exercise: the properties every training objective of the library has, run on a
student's own objective, with the library's centroid and CLIP objectives measured on the same seeded batches.

The properties, on toy batches whose members are their group's direction plus noise (unit features, as the
training loop passes them):

- it returns {"loss": a 0-d tensor};
- it is positive and finite while the noise hides the groups;
- it is lower once the groups separate (little noise) than while the noise hides them;
- its gradient with respect to the image and text features is finite and not zero under noise, and stays finite
  when every text equals its image and when a feature vector is zero (F.normalize's floor).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from cglib.course.feedback import PRACTICE_SEEDS, CheckFailed, passed
from cglib.train.objectives import GroupFeatures, Objective, objective_with
from cglib.viz.dual_effect import group_batch

HIDDEN, SEPARATED = 10.0, 0.1  # the noise that hides the groups, and the noise at which they stand apart
BATCH = (4, 4, 32)  # groups M, pairs N, dimension L
TAU, TAU_INNER, ALPHA = 0.1, 0.1, 0.7  # the train section's defaults


def property_batch(seed: int, noise: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit image and text features (M, N, L) of a seeded toy batch."""
    image, text = group_batch(*BATCH, noise=noise, seed=seed)
    return F.normalize(image, dim=-1), F.normalize(text, dim=-1)


def _loss(objective: torch.nn.Module, image: torch.Tensor, text: torch.Tensor, label: str) -> torch.Tensor:
    out = objective(GroupFeatures(image, text))
    if not isinstance(out, dict) or "loss" not in out:
        got = sorted(out) if isinstance(out, dict) else type(out).__name__
        raise CheckFailed(f"forward must return a dict with a 'loss' entry (other entries are logged parts); got "
                          f"{got} {label}")
    loss = out["loss"]
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise CheckFailed(f"the 'loss' entry is {shape} {label}; return one number as a tensor: average over "
                          "groups (or anchors) with .mean(), and keep it a tensor so the gradient flows")
    return loss.reshape(())


def _gradients(objective, image, text, label: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    image, text = image.clone().requires_grad_(), text.clone().requires_grad_()
    loss = _loss(objective, image, text, label)
    if not loss.requires_grad:
        raise CheckFailed(f"the loss has no gradient {label}: it was computed outside autograd (.item(), numpy, "
                          "torch.no_grad or .detach()), so training could not move the model")
    grad_image, grad_text = torch.autograd.grad(loss, (image, text), allow_unused=True)
    zero = torch.zeros_like(image)
    return loss, zero if grad_image is None else grad_image, zero if grad_text is None else grad_text


def property_failures(objective: torch.nn.Module, seed: int) -> list[str]:
    """The properties `objective` misses on the seeded batches, as sentences (empty: it has them all)."""
    failures = []
    image, text = property_batch(seed, HIDDEN)
    label = f"(seed {seed}, noise {HIDDEN})"
    hidden, grad_image, grad_text = _gradients(objective, image, text, label)
    hidden = hidden.detach()
    if not torch.isfinite(hidden) or hidden <= 0:
        failures.append(f"the loss is {float(hidden):.4g} while noise hides the groups {label}: a loss to "
                        "minimize must be positive and finite when nothing is learned yet")
    if not (torch.isfinite(grad_image).all() and torch.isfinite(grad_text).all()):
        failures.append(f"the gradient is not finite {label}")
    elif grad_image.abs().sum() == 0 and grad_text.abs().sum() == 0:
        failures.append(f"the gradient is zero {label}: the loss does not depend on the features, so training "
                        "changes nothing")
    separated = _loss(objective, *property_batch(seed, SEPARATED), f"(seed {seed}, noise {SEPARATED})").detach()
    if not float(separated) < float(hidden):
        failures.append(f"the loss does not fall as the groups separate: {float(hidden):.4g} at noise {HIDDEN}, "
                        f"{float(separated):.4g} at noise {SEPARATED} (seed {seed}); it must reward a model that "
                        "puts each group's images and texts together and apart from the other groups (check the "
                        "sign of each similarity)")
    aligned = image.clone()
    zeroed_image, zeroed_text = image.clone(), text.clone()
    zeroed_image[0, 0], zeroed_text[1, 1] = 0.0, 0.0
    for case, (i, t) in (("every text equal to its image", (aligned, aligned.clone())),
                         ("a zero feature vector", (zeroed_image, zeroed_text))):
        loss, gi, gt = _gradients(objective, i, t, f"({case}, seed {seed})")
        if not (torch.isfinite(loss) and torch.isfinite(gi).all() and torch.isfinite(gt).all()):
            failures.append(f"the loss or its gradient is not finite with {case} (seed {seed}): normalize with "
                            "F.normalize (it floors the length) and avoid log(0) and 0/0 (use F.cross_entropy or "
                            "torch.logsumexp rather than log(softmax))")
    return failures


def _build(objective_class) -> torch.nn.Module:
    if isinstance(objective_class, torch.nn.Module):
        return objective_class
    if not (isinstance(objective_class, type) and issubclass(objective_class, Objective)):
        raise CheckFailed(f"pass your objective's class (a subclass of Objective); got {objective_class!r}")
    return objective_class({"tau": TAU})


def passes_property_checks(objective_class, seeds: Iterable[int] = PRACTICE_SEEDS) -> bool:
    """Whether the objective has every property on every seed (an unfinished one, raising, has not)."""
    try:
        objective = _build(objective_class)
        return not any(property_failures(objective, seed) for seed in seeds)
    except Exception:  # noqa: BLE001 (any error, a stub's NotImplementedError included, means "not yet")
        return False


def library_losses(seed: int) -> dict[str, tuple[float, float]]:
    """The library's centroid and CLIP objectives at the hidden and the separated noise, for comparison."""
    objectives = {"centroid": objective_with("centroid", TAU, tau_inner=TAU_INNER, alpha=ALPHA),
                  "clip": objective_with("clip", TAU)}
    with torch.no_grad():
        return {name: tuple(float(o(GroupFeatures(*property_batch(seed, noise)))["loss"])
                            for noise in (HIDDEN, SEPARATED)) for name, o in objectives.items()}


def check_objective(objective_class, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """Your objective class must have every property of the module docstring on every seeded batch; the library's
    centroid and CLIP objectives have them too (their values are printed beside yours)."""
    seeds = tuple(seeds)
    objective = _build(objective_class)
    for seed in seeds:
        failures = property_failures(objective, seed)
        if failures:
            raise CheckFailed(f"{type(objective).__name__} misses {len(failures)} propert"
                              f"{'y' if len(failures) == 1 else 'ies'}:\n" + "\n".join(f"  - {f}" for f in failures))
    seed = seeds[0]
    yours = tuple(float(_loss(objective, *property_batch(seed, noise), "").detach()) for noise in (HIDDEN, SEPARATED))
    print(f"loss at noise {HIDDEN} -> {SEPARATED} (seed {seed}): yours {yours[0]:.4f} -> {yours[1]:.4f}; "
          + "; ".join(f"{name} {a:.4f} -> {b:.4f}" for name, (a, b) in library_losses(seed).items()))
    passed("your objective on the properties its own objectives have (positive under noise, lower once groups "
           "separate, finite gradients)", seeds)
