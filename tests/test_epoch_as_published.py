"""The authors' image-text epoch (train.epoch: pairs_as_published, issue #32 item 1) against a literal
re-implementation of their TrainConceptDataset, DataLoader (batch size M, shuffle, drop_last) and training loop
(the first M groups of each collated batch), given the same shuffles and draws."""

from __future__ import annotations

import numpy as np
import pytest

from cglib.train.epochs import PublishedPairsEpoch
from cglib.train.sampler import GroupBatchSampler, epoch_sizes
from tests.factories import tiny_magic


def authors_epoch(pairs, hard, n, m, order, choices):
    """TrainConceptDataset._load_data_train + __getitem__ and their loader/loop, literally (data order kept)."""
    processed_initial = []
    for concept, captions in pairs.items():
        if len(hard.get(concept, [])) < m - 1:
            continue
        for i in range(0, len(captions), n):
            if i + n <= len(captions):
                group = {"hard_negatives": hard.get(concept, []), "concept": concept, "items": captions[i:i + n]}
                if len(group["items"]) == n and len(group["hard_negatives"]) >= m - 1:
                    processed_initial.append(group)
    lookup = {g["concept"]: g for g in processed_initial}
    data = []
    for group in processed_initial:
        valid = [h for h in group["hard_negatives"] if h in lookup]
        if len(valid) >= m - 1:
            data.append({**group, "hard_negatives": valid})
    steps = []
    for k in range(len(data) // m):  # DataLoader(batch_size=m, shuffle=True, drop_last=True): batch k
        item = data[order[k * m]]  # the loop trains the first M groups of the collated batch: item 0's
        negatives = choices(k, item["hard_negatives"], m - 1)
        negative_groups = [next(o for o in data if o["concept"] == h) for h in negatives]
        steps.append(([item["concept"], *negatives], [item["items"], *[g["items"] for g in negative_groups]]))
    return steps


def sampler_and_draws(magic, m, n, seed=3):
    sampler = GroupBatchSampler(magic, m, n, seed, epoch="pairs_as_published")
    epoch = 1
    order = np.random.default_rng([seed, epoch, 5]).permutation(len(sampler.plan.items))

    def choices(k, pool, size):  # the sampler's own draw for batch k, replayed
        return [pool[i] for i in np.random.default_rng([seed, epoch, k, 1]).integers(len(pool), size=size)]

    return sampler, epoch, order, choices


@pytest.mark.parametrize(("m", "n", "crossed"), [(2, 5, False), (3, 4, True), (2, 12, False), (3, 7, True)])
def test_the_authors_epoch_gives_the_same_batches_for_the_same_draws(m, n, crossed):
    """Siblings are each other's only hard negative in tiny_magic; `crossed`: every other concept is one (M = 3)."""
    magic, _ = tiny_magic(per_group=12)
    if crossed:
        l1 = [node.id for node in magic.nodes_at(1)]
        for nid in l1:
            magic.nodes[nid].hard_negatives = [o for o in l1 if o != nid]
    sampler, epoch, order, choices = sampler_and_draws(magic, m, n)
    theirs = authors_epoch(sampler.pairs, sampler._hard, n, m, order, choices)
    ours = [sampler.batch(epoch, k) for k in range(len(sampler))]
    assert len(ours) == len(theirs) > 0
    for batch, (groups, chunks) in zip(ours, theirs):
        assert batch.groups == groups
        assert [list(zip(i, t)) for i, t in zip(batch.image_ids, batch.texts)] == [list(c) for c in chunks]
        assert not batch.used_fallback and batch.repeated_images == 0


def test_what_the_authors_epoch_leaves_out_is_counted():
    """Incomplete chunks, concepts without M-1 hard negatives with a complete chunk, and the M-1 of every M chunks
    the loop never trains, each counted; with replacement a batch can hold one negative concept twice."""
    pairs = {"A": [(f"a{i}", "t") for i in range(25)], "B": [(f"b{i}", "t") for i in range(10)],
             "C": [(f"c{i}", "t") for i in range(7)], "D": [(f"d{i}", "t") for i in range(30)]}
    hard = {"A": ["C", "B"], "B": ["A"], "C": ["A"], "D": ["C"]}
    plan = PublishedPairsEpoch(pairs, 10, 2, hard, seed=0)
    assert plan.kept == ["A", "B"]  # C has no complete chunk; D's only hard negative is C
    assert [g for g, _ in plan.items] == ["A", "A", "B"] and len(plan) == 1
    assert plan.dropped == {"pairs_in_incomplete_chunks": 5 + 7, "concepts_without_m_minus_1_hard_negatives": 1,
                            "chunks_loaded_but_not_trained": 2, "anchors_with_dropped_candidates": 0}
    assert plan.first_chunk["A"] == pairs["A"][:10]
    three = PublishedPairsEpoch({g: [(f"{g}{i}", "t") for i in range(10)] for g in "PQRS"}, 10, 3,
                                {g: [h for h in "PQRS" if h != g] for g in "PQRS"}, seed=0)
    draws = [three.negatives("P", np.random.default_rng(s)) for s in range(30)]
    assert any(a == b for a, b in draws) and all("P" not in d for d in draws)


def test_the_authors_epoch_trains_and_reports_its_size(tmp_path):
    """A run with train.epoch: pairs_as_published trains (its summary says so) and epoch_sizes lists it; a world too
    small for it is an error naming the fix, and 0 in epoch_sizes."""
    from test_train import make_run

    from cglib.train import train_one

    magic, _ = tiny_magic(per_group=12)
    sizes = epoch_sizes(magic, 2, 5)
    assert sizes["pairs_as_published"] == len(GroupBatchSampler(magic, 2, 5, 0, epoch="pairs_as_published")) > 0
    assert epoch_sizes(magic, 2, 500)["pairs_as_published"] == 0
    with pytest.raises(ValueError, match="keeps no batch.*lower pairs_per_group"):
        GroupBatchSampler(magic, 2, 500, 0, epoch="pairs_as_published")
    run = make_run(tmp_path, epoch="pairs_as_published", runs=[{"name": "p", "loss": "pairwise"}])
    summary = train_one(run, "p", progress=False)
    assert summary["steps"] > 0 and summary["epoch_kind"] == "pairs_as_published"
