"""Checks of notebook 05's exercises: the optimizer steps of an epoch, one group batch and the learning-rate
schedule, each against the library (`epoch_sizes`, `GroupBatchSampler.batch`, `warmup_cosine`) on seeded cases
drawn from a MAGIC file (the run's own in the notebook)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import torch

from cglib.course.feedback import PRACTICE_SEEDS, CheckFailed, describe_case, passed
from cglib.magic.schema import MagicFile
from cglib.train.optim import warmup_cosine
from cglib.train.sampler import GroupBatchSampler, epoch_sizes

STEP_EPOCHS = ("groups", "pairs")  # the epoch rules the exercise asks for (the authors' one is a question)


# --- the optimizer steps of an epoch ------------------------------------------------------------------------------

def step_case(magic: MagicFile, seed: int, available_images: set[str] | None = None) -> dict:
    """A seeded batch shape, gradient accumulation and set of usable images: some training images are missing
    (unreadable, say), and one whole group loses all of its images, so counting the groups of the MAGIC file is
    not the same as counting the groups a batch can anchor."""
    rng = np.random.default_rng([seed, 5])
    train = [i for i in magic.split_ids("train") if available_images is None or i in available_images]
    groups = sorted({magic.images[i].node for i in train})
    if len(groups) < 3:
        raise ValueError(f"the MAGIC file has {len(groups)} training groups with usable images; the step-count "
                         "check needs at least 3 (use the run's magic/magic.json)")
    lost = groups[int(rng.integers(len(groups)))]
    kept = {i for i in train if magic.images[i].node != lost and rng.random() > 0.2}
    return {"groups_per_batch": int(rng.integers(2, 4)), "pairs_per_group": int(rng.choice([2, 3, 4, 8, 16])),
            "grad_accum": (1, 2, 3)[seed % 3], "available_images": kept}  # every accumulation among 3 seeds


def _groups_with_images(magic: MagicFile, available: set[str]) -> list[str]:
    return sorted({magic.images[i].node for i in magic.split_ids("train") if i in available})


def _step_hints(magic: MagicFile, kind: str, yours: int, case: dict) -> list[str]:
    """Plausible mistakes recognised by value."""
    n, accum, available = case["pairs_per_group"], case["grad_accum"], case["available_images"]
    groups = _groups_with_images(magic, available)
    images = {g: [i for i in magic.images_of(g, "train") if i in available] for g in groups}
    pairs = {g: sum(len(magic.generalized_texts(i)) for i in ids) for g, ids in images.items()}

    def steps(batches: int) -> int:
        return -(-batches // accum)

    hints = []
    if kind == "groups" and yours in (len(magic.groups("train")), steps(len(magic.groups("train")))) \
            and len(magic.groups("train")) != len(groups):
        hints.append(f"you counted every training group of the MAGIC file ({len(magic.groups('train'))}); a group "
                     f"none of whose images is in available_images can never anchor a batch ({len(groups)} can)")
    exact = len(groups) if kind == "groups" else sum(-(-p // n) for p in pairs.values())
    if accum > 1 and yours == exact:
        hints.append(f"that is the number of batches ({exact}); with grad_accum={accum} one optimizer step takes "
                     f"{accum} batches")
    if accum > 1 and yours == exact // accum and exact % accum:
        hints.append("round up: the last, incomplete accumulation still makes an optimizer step")
    if kind == "pairs":
        total = sum(pairs.values())
        if yours in (math.ceil(total / n), steps(math.ceil(total / n))) and math.ceil(total / n) != exact:
            hints.append("you cut all the pairs into chunks of N at once; the pairs epoch cuts each concept's pairs "
                         "separately (a batch's anchor is one concept), so each concept's last chunk is padded to N")
        by_images = sum(-(-len(ids) // n) for ids in images.values())
        if yours in (by_images, steps(by_images)) and by_images != exact:
            hints.append("you counted images; a pair is an image with ONE of its generalized captions "
                         "(magic.generalized_texts(image)), so an image with k captions gives k pairs")
        floored = sum(p // n for p in pairs.values())
        if yours in (floored, steps(floored)) and floored != exact:
            hints.append("a concept's last, shorter chunk is padded to N with its other pairs, not dropped "
                         "(dropping it is the authors' epoch, pairs_as_published)")
    return hints


def check_steps_per_epoch(fn: Callable, magic: MagicFile, available_images: set[str] | None = None,
                          seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(magic, groups_per_batch, pairs_per_group, epoch, available_images, grad_accum)` -> the optimizer steps
    of one epoch must equal `epoch_sizes(...)[epoch]` for both epoch rules on every seeded case."""
    seeds = tuple(seeds)
    for seed in seeds:
        case = step_case(magic, seed, available_images)
        expected = epoch_sizes(magic, case["groups_per_batch"], case["pairs_per_group"], "generalized",
                               case["available_images"], case["grad_accum"])
        for kind in STEP_EPOCHS:
            answer = fn(magic, case["groups_per_batch"], case["pairs_per_group"], kind, set(case["available_images"]),
                        case["grad_accum"])
            if isinstance(answer, float) and answer.is_integer():
                answer = int(answer)
            if not isinstance(answer, (int, np.integer)):
                raise CheckFailed(f"return the number of optimizer steps as an int; got {type(answer).__name__}")
            if int(answer) == expected[kind]:
                continue
            shown = {k: v for k, v in case.items() if k != "available_images"}
            shown["usable images"] = len(case["available_images"])
            lines = [f"epoch: {kind!r} on the case {describe_case(shown)} (seed {seed}):",
                     f"  yours {int(answer)} optimizer steps, the library's {expected[kind]}"]
            hints = _step_hints(magic, kind, int(answer), case)
            lines += [f"  hint: {h}" for h in hints] or [
                ("  hint: groups: one batch per training group that has a usable image; pairs: per group, ceil(its "
                 "(image, caption) pairs / N); then ceil(batches / grad_accum)")]
            raise CheckFailed("\n".join(lines))
    passed("your step counts (groups and pairs epochs)", seeds)


# --- one group batch ----------------------------------------------------------------------------------------------

def batch_case(magic: MagicFile, seed: int, available_images: set[str] | None = None) -> tuple[GroupBatchSampler,
                                                                                                 int, int]:
    """A groups-epoch sampler with a seeded M, N and sampler seed, and a seeded (epoch, index) whose anchor has at
    least M-1 threshold hard negatives (no fallback: the exercise leaves fallbacks to the library)."""
    rng = np.random.default_rng([seed, 6])
    n = int(rng.choice([2, 3, 5, 8]))
    probe = GroupBatchSampler(magic, 2, n, 0, "generalized", available_images, epoch="groups")
    most = max(len(probe.hard_negatives(g)) for g in probe.groups)
    if most == 0:
        raise ValueError("no training group of this MAGIC file has a hard negative that is a training group; the "
                         "batch check needs one (use the run's magic/magic.json, or lower magic.hard_negative_sim)")
    m = int(rng.integers(2, min(most, 3) + 2))
    sampler = GroupBatchSampler(magic, m, n, int(rng.integers(1000)), "generalized", available_images, epoch="groups")
    epoch = int(rng.integers(3))
    usable = [k for k, g in enumerate(sampler.epoch_order(epoch)) if len(sampler.hard_negatives(g)) >= m - 1]
    return sampler, epoch, usable[int(rng.integers(len(usable)))]


def _as_batch(answer) -> tuple[list[str], list[list[str]], list[list[str]]]:
    if not isinstance(answer, (tuple, list)) or len(answer) != 3:
        raise CheckFailed("return three lists, (groups, image_ids, texts): the M group ids (anchor first), then per "
                          "group its N image ids and its N texts")
    groups, image_ids, texts = answer
    return list(groups), [list(x) for x in image_ids], [list(x) for x in texts]


def _batch_failure(what: str, yours, expected, sampler: GroupBatchSampler, epoch: int, index: int, hint: str
                   ) -> CheckFailed:
    case = {"M": sampler.m, "N": sampler.n, "sampler seed": sampler.seed, "epoch": epoch, "index": index}
    return CheckFailed(f"{what} differ on the case {describe_case(case)}:\n  yours      {yours}\n"
                       f"  the sampler's {expected}\n  hint: {hint}")


def check_group_batch(fn: Callable, magic: MagicFile, available_images: set[str] | None = None,
                      seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(sampler, epoch, index)` -> (groups, image_ids, texts) must equal `sampler.batch(epoch, index)` of a
    groups epoch on every seeded case (the anchor, the negatives in order, every image and every text)."""
    seeds = tuple(seeds)
    for seed in seeds:
        sampler, epoch, index = batch_case(magic, seed, available_images)
        groups, image_ids, texts = _as_batch(fn(sampler, epoch, index))
        batch = sampler.batch(epoch, index)
        if not groups or groups[0] != batch.anchor:
            raise _batch_failure("the anchors", groups[:1], [batch.anchor], sampler, epoch, index,
                                 "the anchor of batch `index` is position `index` of the epoch's seeded order of "
                                 "the training groups, sampler.epoch_order(epoch)[index]")
        if groups != batch.groups:
            if sorted(groups) == sorted(batch.groups):
                hint = ("the same groups in another order: keep the drawn negatives in the order of the "
                        "hard-negative list (sort the drawn positions)")
            elif len(groups) != len(batch.groups):
                hint = f"a batch has M = {sampler.m} groups: the anchor and M-1 = {sampler.m - 1} negatives"
            elif not set(groups[1:]) <= set(sampler.hard_negatives(batch.anchor)):
                hint = "every negative is one of sampler.hard_negatives(anchor), drawn without replacement"
            else:
                hint = ("other hard negatives: draw them first from the batch's own stream, "
                        "np.random.default_rng([sampler.seed, epoch, index, 1]), with rng.choice(len(hard), M-1, "
                        "replace=False)")
            raise _batch_failure("the groups", groups, batch.groups, sampler, epoch, index, hint)
        for k, group in enumerate(batch.groups):
            role = "the anchor" if k == 0 else f"negative {k}"
            if image_ids[k] != batch.image_ids[k]:
                same = sorted(image_ids[k]) == sorted(batch.image_ids[k])
                hint = ("the same images in another order: " if same else f"N = {sampler.n} images of the group: ")
                hint += ("one rng.permutation of sampler.images[group], repeated until N, drawn from the batch's "
                         "one stream, np.random.default_rng([sampler.seed, epoch, index, 1]), group after group "
                         "(the negatives first, then each group's images and its texts)")
                raise _batch_failure(f"the images of {role} ({group})", image_ids[k], batch.image_ids[k], sampler,
                                     epoch, index, hint)
            if texts[k] != batch.texts[k]:
                hint = ("node-level captions: a permutation of the group's captions cycled to N, drawn right after "
                        "the group's images" if sampler.group_texts else
                        "per image, one of its own texts: sampler.texts[image][rng.integers(len(...))]")
                raise _batch_failure(f"the texts of {role} ({group})", texts[k], batch.texts[k], sampler, epoch,
                                     index, hint)
    passed("your group batches (anchor, hard negatives, images and texts)", seeds)


# --- the learning-rate schedule -----------------------------------------------------------------------------------

def schedule_case(seed: int) -> dict:
    rng = np.random.default_rng([seed, 7])
    warmup = int(rng.integers(1, 30))
    total = warmup + int(rng.integers(5, 200))
    steps = sorted({0, warmup - 1, warmup, warmup + 1, (warmup + total) // 2, total - 1, total, total + 3,
                    *rng.integers(0, total, 5).tolist()})
    return {"peak_lr": float(rng.choice([1e-3, 5e-4, 2e-4])), "warmup_steps": warmup, "total_steps": total,
            "steps": steps}


def library_learning_rate(step: int, peak_lr: float, warmup_steps: int, total_steps: int) -> float:
    """The learning rate `warmup_cosine` gives at optimizer step `step` (0 = the first step)."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=peak_lr)
    return peak_lr * warmup_cosine(optimizer, warmup_steps, total_steps).lr_lambdas[0](step)


def _schedule_hint(step: int, yours: float, case: dict) -> str:
    peak, warmup, total = case["peak_lr"], case["warmup_steps"], case["total_steps"]
    if step < warmup and math.isclose(yours, peak * step / warmup, rel_tol=1e-6, abs_tol=1e-15):
        return (f"warmup off by one: step 0 is the first optimizer step and already takes a step of size "
                f"peak/{warmup}, (step + 1) / warmup_steps, reaching the peak at step warmup_steps - 1")
    if step >= warmup and math.isclose(yours, peak * 0.5 * (1 + math.cos(math.pi * step / total)), rel_tol=1e-6):
        return "the cosine's progress counts from the end of warmup: (step - warmup) / (total - warmup)"
    if step > total:
        return "after total_steps the rate stays at 0: clamp the progress at 1"
    return ("linear warmup to the peak over warmup_steps, then 0.5 * (1 + cos(pi * progress)) times the peak, "
            "progress = (step - warmup) / (total - warmup)")


def check_learning_rate(fn: Callable, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(step, peak_lr, warmup_steps, total_steps)` -> the learning rate at that optimizer step must equal
    `warmup_cosine`'s on every step of every seeded case."""
    seeds = tuple(seeds)
    for seed in seeds:
        case = schedule_case(seed)
        for step in case["steps"]:
            yours = float(fn(step, case["peak_lr"], case["warmup_steps"], case["total_steps"]))
            expected = library_learning_rate(step, case["peak_lr"], case["warmup_steps"], case["total_steps"])
            if not math.isclose(yours, expected, rel_tol=1e-6, abs_tol=1e-12):
                shown = {k: v for k, v in case.items() if k != "steps"}
                raise CheckFailed(f"the learning rate at step {step} differs on the case {describe_case(shown)}:\n"
                                  f"  yours {yours:.6g}, the library's {expected:.6g}\n"
                                  f"  hint: {_schedule_hint(step, yours, case)}")
    passed("your learning-rate schedule (linear warmup, then cosine to 0)", seeds)
