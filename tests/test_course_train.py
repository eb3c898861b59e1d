"""The course of notebooks 05 and 06: each check passes the notebook's own solution on the practice and grading
seeds, and fails plausible wrong answers with a message that names the mistake."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import nbformat
import numpy as np
import pytest
from factories import tiny_magic
from test_course import fails_with

from cglib.course import GRADING_SEEDS, PRACTICE_SEEDS, CheckFailed
from cglib.course.evaluation_checks import check_forced_choice, check_paired_interval
from cglib.course.training_checks import check_group_batch, check_learning_rate, check_steps_per_epoch

REPO = Path(__file__).resolve().parent.parent
TRAINING = "05_training.ipynb"
EVALUATION = "06_evaluation.ipynb"


def solution_function(notebook: str, name: str):
    """The function `name` as the notebook's exercise cell defines it, with that cell's imports (its check call,
    which reads the run, is left out)."""
    nb = nbformat.read(REPO / "notebooks" / notebook, as_version=4)
    source = next(c.source for c in nb.cells if c.cell_type == "code" and f"def {name}(" in c.source)
    tree = ast.parse(source)
    tree.body = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
                 or (isinstance(node, ast.FunctionDef) and node.name == name)]
    namespace: dict = {}
    exec(compile(tree, f"{notebook}:{name}", "exec"), namespace)  # noqa: S102 (the repository's own notebook)
    return namespace[name]


@pytest.fixture(scope="module")
def magic():
    """Six l1 groups, each with one hard negative (its sibling), node-level captions (magic.generalize: group)."""
    return tiny_magic(per_group=8)[0]


@pytest.fixture(scope="module")
def per_image_magic(magic):
    """The same groups with captions per image (magic.generalize: image), as the demo's MAGIC has them: an image
    holds one to three of its own generalized captions."""
    copy = magic.model_copy(deep=True)
    copy.generalize = "image"
    for k, record in enumerate(sorted(copy.images.values(), key=lambda r: r.id)):
        record.generalized_captions = [f"{record.node} caption {j} of {record.id}" for j in range(1 + k % 3)]
    return copy


def test_the_notebook_solutions_pass_on_the_practice_and_the_grading_seeds(magic, per_image_magic, capsys):
    steps = solution_function(TRAINING, "my_steps_per_epoch")
    batch = solution_function(TRAINING, "my_group_batch")
    rate = solution_function(TRAINING, "my_learning_rate")
    for seeds in (PRACTICE_SEEDS, GRADING_SEEDS):
        for data in (magic, per_image_magic):
            check_steps_per_epoch(steps, data, seeds=seeds)
            check_group_batch(batch, data, seeds=seeds)
        check_learning_rate(rate, seeds=seeds)
        check_forced_choice(solution_function(EVALUATION, "my_forced_choice"), seeds=seeds)
        check_paired_interval(solution_function(EVALUATION, "my_paired_interval"), seeds=seeds)
    assert capsys.readouterr().out.count("Correct:") == 2 * 7


# --- notebook 05: the steps of an epoch ---------------------------------------------------------------------------

def steps_variant(magic, m, n, epoch, available, accum, *, all_groups=False, by_images=False, global_chunks=False,
                  floor=False, no_accum=False):
    usable: dict[str, list[str]] = {}
    for image_id in magic.split_ids("train"):
        if (all_groups and epoch == "groups") or image_id in available:
            usable.setdefault(magic.images[image_id].node, []).append(image_id)
    pairs = {g: len(ids) if by_images else sum(len(magic.generalized_texts(i)) for i in ids)
             for g, ids in usable.items()}
    if epoch == "groups":
        batches = len(usable)
    elif global_chunks:
        batches = math.ceil(sum(pairs.values()) / n)
    else:
        batches = sum((p // n) if floor else math.ceil(p / n) for p in pairs.values())
    return batches if no_accum else math.ceil(batches / accum)


def test_step_check_names_unusable_groups_images_chunks_and_accumulation(magic, per_image_magic):
    check = lambda data: lambda fn: check_steps_per_epoch(fn, data)
    variant = lambda **slip: lambda *a: steps_variant(*a, **slip)
    check_steps_per_epoch(variant(), per_image_magic)
    fails_with(check(magic), variant(all_groups=True), "epoch: 'groups'", "every training group",
               "can never anchor a batch")
    fails_with(check(per_image_magic), variant(by_images=True), "epoch: 'pairs'", "you counted images",
               "k captions gives k pairs")
    fails_with(check(per_image_magic), variant(global_chunks=True), "each concept's pairs separately")
    fails_with(check(per_image_magic), variant(floor=True), "padded to N", "not dropped")
    fails_with(check(magic), variant(no_accum=True), "the number of batches", "grad_accum=")
    fails_with(check(magic), lambda *a: "12", "as an int")


# --- notebook 05: one group batch ---------------------------------------------------------------------------------

def batch_variant(sampler, epoch, index, *, anchor_first_order=False, reverse_negatives=False, own_stream=False,
                  images_sorted=False):
    """The notebook's solution with one slip switched on."""
    rng = np.random.default_rng([sampler.seed, epoch] if own_stream else [sampler.seed, epoch, index, 1])
    anchor = sampler.groups[index] if anchor_first_order else sampler.epoch_order(epoch)[index]
    hard = sampler.hard_negatives(anchor)
    picked = sorted(rng.choice(len(hard), size=sampler.m - 1, replace=False))
    negatives = [hard[i] for i in picked]
    groups = [anchor] + (negatives[::-1] if reverse_negatives else negatives)

    def cycled(items):
        order = sorted(items) if images_sorted else [items[i] for i in rng.permutation(len(items))]
        return (order * math.ceil(sampler.n / len(order)))[:sampler.n]

    image_ids, texts = [], []
    for group in groups:
        ids = cycled(sampler.images[group])
        image_ids.append(ids)
        if sampler.group_texts:
            texts.append(cycled(sampler.texts[ids[0]]) if not images_sorted else
                         [sampler.texts[ids[0]][rng.permutation(len(sampler.texts[ids[0]]))[0]]] * sampler.n)
        else:
            texts.append([sampler.texts[i][rng.integers(len(sampler.texts[i]))] for i in ids])
    return groups, image_ids, texts


def test_batch_check_names_the_anchor_the_negatives_order_and_the_stream(magic, per_image_magic):
    from cglib.train.sampler import GroupBatchSampler

    variant = lambda **slip: lambda *a: batch_variant(*a, **slip)
    check_group_batch(variant(), per_image_magic)
    fails_with(lambda fn: check_group_batch(fn, magic), variant(anchor_first_order=True), "the anchors differ",
               "sampler.epoch_order(epoch)[index]")
    fails_with(lambda fn: check_group_batch(fn, magic), variant(images_sorted=True), "the images of the anchor",
               "permutation of sampler.images[group]")
    fails_with(lambda fn: check_group_batch(fn, per_image_magic), variant(own_stream=True), "differ",
               "default_rng([sampler.seed, epoch, index, 1])")
    fails_with(lambda fn: check_group_batch(fn, magic), lambda *a: (["x"], [], []), "the anchors differ")
    fails_with(lambda fn: check_group_batch(fn, magic), lambda *a: None, "return three lists")
    # three-group batches need two hard negatives: give every group of the tiny MAGIC two, and the order shows
    wide = magic.model_copy(deep=True)
    groups = sorted(wide.groups("train"))
    for k, group in enumerate(groups):
        wide.nodes[group].hard_negatives = [groups[(k + 1) % len(groups)], groups[(k + 2) % len(groups)]]
    sampler = GroupBatchSampler(wide, 3, 2, 0, epoch="groups")
    assert all(len(sampler.hard_negatives(g)) == 2 for g in sampler.groups)
    message = fails_with(lambda fn: check_group_batch(fn, wide, seeds=range(12)), variant(reverse_negatives=True),
                         "the groups differ")
    assert "another order" in message and "hard-negative list" in message


# --- notebook 05: the learning rate -------------------------------------------------------------------------------

def rate_variant(step, peak, warmup, total, *, warmup_from_zero=False, progress_over_total=False, unclamped=False):
    if step < warmup:
        return peak * (step if warmup_from_zero else step + 1) / warmup
    progress = step / total if progress_over_total else (step - warmup) / (total - warmup)
    return peak * 0.5 * (1 + math.cos(math.pi * (progress if unclamped else min(1.0, progress))))


def test_learning_rate_check_names_the_off_by_one_the_progress_and_the_clamp():
    variant = lambda **slip: lambda *a: rate_variant(*a, **slip)
    check_learning_rate(variant())
    fails_with(check_learning_rate, variant(warmup_from_zero=True), "at step 0", "warmup off by one",
               "(step + 1) / warmup_steps")
    fails_with(check_learning_rate, variant(progress_over_total=True), "counts from the end of warmup")
    fails_with(check_learning_rate, variant(unclamped=True), "stays at 0", "clamp")


# --- notebook 06: the forced choice -------------------------------------------------------------------------------

def forced_choice_variant(fc, image_vectors, text_vectors, text_index, *, ties_right=False, swapped=False,
                          first_negative_only=False):
    anchor_text = text_vectors[[text_index[t] for t in fc.anchor_texts]]
    anchor_image = image_vectors[fc.anchors]
    own = (anchor_text * anchor_image).sum(axis=1)
    negative_texts = text_vectors[[[text_index[t] for t in row] for row in fc.negative_texts]]
    to_images = np.einsum("nd,nmd->nm", anchor_text, image_vectors[fc.negative_images])
    to_texts = np.einsum("nd,nmd->nm", anchor_image, negative_texts)
    reduce = (lambda s: s[:, 0]) if first_negative_only else (lambda s: s.max(axis=1))
    wins = np.greater_equal if ties_right else np.greater
    t2i, i2t = wins(own, reduce(to_images)), wins(own, reduce(to_texts))
    return (i2t, t2i) if swapped else (t2i, i2t)


def test_forced_choice_check_names_ties_swapped_directions_and_the_best_negative():
    variant = lambda **slip: lambda *a: forced_choice_variant(*a, **slip)
    check_forced_choice(variant())
    fails_with(check_forced_choice, variant(ties_right=True), "exactly at a tie", "ties count as WRONG")
    fails_with(check_forced_choice, variant(swapped=True), "directions are swapped")
    fails_with(check_forced_choice, variant(first_negative_only=True), "BEST of its M-1 negatives")
    fails_with(check_forced_choice, lambda fc, *a: (np.zeros(3), np.zeros(3)), "has shape (3,)")


def test_a_wrong_forced_choice_fails_on_the_grading_seeds_too():
    with pytest.raises(CheckFailed, match="ties count as WRONG"):
        check_forced_choice(lambda *a: forced_choice_variant(*a, ties_right=True), seeds=GRADING_SEEDS)


# --- notebook 06: the paired bootstrap interval -------------------------------------------------------------------

def interval_variant(a, b, units, resamples, ci, seed, *, by_query=False, unit_means=False, unpaired=False):
    from cglib.evaluate.bootstrap import resample_weights

    if by_query:
        units = np.arange(units.size)
    labels, inverse = np.unique(units, return_inverse=True)
    counts = np.bincount(inverse, minlength=labels.size)
    weights = resample_weights(labels.size, resamples, seed)
    tail = (1 - ci) / 2

    def resampled(values):
        sums = np.bincount(inverse, weights=values, minlength=labels.size)
        if unit_means:
            return (weights @ (sums / counts)) / weights.sum(axis=1)
        return (weights @ sums) / (weights @ counts)

    if unpaired:
        low_a, high_a = np.quantile(resampled(a), [tail, 1 - tail])
        low_b, high_b = np.quantile(resampled(b), [tail, 1 - tail])
        return a.mean() - b.mean(), low_a - low_b, high_a - high_b
    low, high = np.quantile(resampled(a - b), [tail, 1 - tail])
    return (a - b).mean(), low, high


def test_paired_interval_check_names_queries_unit_means_and_unpaired_intervals():
    variant = lambda **slip: lambda *a: interval_variant(*a, **slip)
    check_paired_interval(variant())
    fails_with(check_paired_interval, variant(by_query=True), "you resampled queries", "whole units")
    fails_with(check_paired_interval, variant(unit_means=True), "not the mean of unit means")
    fails_with(check_paired_interval, variant(unpaired=True), "interval of the difference", "same draws")
    fails_with(check_paired_interval, lambda a, b, *rest: (a.mean(), 0.0, 1.0), "the plain mean of a - b")
    fails_with(check_paired_interval, lambda *a: 0.5, "return three numbers")
