"""Group batches: an anchor and M-1 hard negatives (flagged fallbacks otherwise), N pairs per group, deterministic."""

from __future__ import annotations

from collections import Counter

import pytest
from factories import tiny_magic

from cglib.train.pretrain import TextPairSampler
from cglib.train.sampler import GroupBatchSampler


@pytest.fixture(scope="module")
def magic():
    return tiny_magic(per_group=8)[0]


def test_every_group_is_anchor_once_per_epoch_and_groups_are_distinct(magic):
    """An epoch has one batch per training group, each group anchors exactly once, no group repeats in a batch."""
    sampler = GroupBatchSampler(magic, groups_per_batch=3, pairs_per_group=4, seed=1)
    for epoch in range(3):
        batches = list(sampler.epoch(epoch))
        assert len(batches) == len(sampler) == len(magic.groups("train")) == 6
        assert sorted(b.anchor for b in batches) == sorted(magic.groups("train"))
        for b in batches:
            assert len(set(b.groups)) == len(b.groups) == 3
            assert b.shape == (3, 4)


def test_negatives_are_hard_negatives_or_flagged_fallbacks(magic):
    """Each negative is a hard negative of the anchor, or flagged; fallbacks come only when hard ones run out."""
    for m in (2, 3, 6):
        sampler = GroupBatchSampler(magic, groups_per_batch=m, pairs_per_group=2, seed=0)
        for b in sampler.epoch(0):
            hard = set(magic.negatives(b.anchor, include_fallback=False))
            assert b.fallback[0] is False
            for group, flagged in zip(b.groups[1:], b.fallback[1:]):
                assert flagged == (group not in hard)
            assert b.n_fallback == max(0, m - 1 - len(hard))  # hard negatives are used before any fallback
            assert b.used_fallback == (b.n_fallback > 0)


def test_fallbacks_prefer_the_nearest_groups_in_the_hierarchy(magic):
    """In tiny_magic each group has one hard negative (its sibling); the fallback shares the lowest ancestor left."""
    sampler = GroupBatchSampler(magic, groups_per_batch=3, pairs_per_group=2, seed=0)
    for b in sampler.epoch(0):
        fallback = b.groups[2]
        assert b.fallback == [False, False, True]
        cousins = [g for g in magic.groups("train") if g not in b.groups[:2]
                   and magic.ancestor(g, 3) == magic.ancestor(b.anchor, 3)]
        # meal/celebration groups have cousins under l3 "social gathering"; sport groups only share l4
        assert (fallback in cousins) if cousins else magic.ancestor(fallback, 4) == magic.ancestor(b.anchor, 4)
    assert {b.anchor for b in sampler.epoch(0) if magic.ancestor(b.groups[2], 3) == magic.ancestor(b.anchor, 3)} \
        == {"l1:birthday party", "l1:wedding", "l1:breakfast", "l1:picnic"}


def test_node_fallback_negatives_come_first():
    """A node's own fallback_negatives (the DAG builder's most similar below threshold) are taken first."""
    magic = tiny_magic()[0]
    anchor = "l1:birthday party"
    magic.nodes[anchor].fallback_negatives = ["l1:picnic", "l1:ski trip"]
    sampler = GroupBatchSampler(magic, groups_per_batch=3, pairs_per_group=2, seed=0)
    rng_batches = [b for b in sampler.epoch(0) if b.anchor == anchor]
    assert rng_batches[0].groups == [anchor, "l1:wedding", "l1:picnic"]
    assert rng_batches[0].fallback == [False, False, True]


def test_batches_are_deterministic_from_the_seed(magic):
    """Same seed, epoch and index give the same batch (resume and DDP rely on it); another seed differs."""
    a = GroupBatchSampler(magic, 3, 4, seed=7)
    b = GroupBatchSampler(magic, 3, 4, seed=7)
    c = GroupBatchSampler(magic, 3, 4, seed=8)
    assert [x for x in a.epoch(2)] == [y for y in b.epoch(2)]
    assert a.batch(1, 3) == b.batch(1, 3)
    assert [x.image_ids for x in a.epoch(0)] != [x.image_ids for x in c.epoch(0)]
    assert a.epoch_order(0) != a.epoch_order(1)  # every epoch reshuffles the anchors


def test_pairs_come_from_the_group_and_small_groups_cycle(magic):
    """Images are the group's training images; with N > group size every image is used before any repeats."""
    sampler = GroupBatchSampler(magic, groups_per_batch=2, pairs_per_group=14, seed=0)
    batch = sampler.batch(0, 0)
    train_size = len(magic.images_of(batch.anchor, "train"))  # 6 of 8 per tiny group
    assert train_size == 6
    for group, ids in zip(batch.groups, batch.image_ids):
        assert set(ids) == set(magic.images_of(group, "train"))
        counts = Counter(ids)
        assert max(counts.values()) - min(counts.values()) <= 1  # cycled, not sampled with replacement
    assert batch.repeated_images == 2 * (14 - 6)
    assert len(sampler.groups_below_n) == 6


def test_generalized_texts_cycle_through_the_groups_captions(magic):
    """text_source generalized: texts are the group's generalized captions, each used before any repeats."""
    sampler = GroupBatchSampler(magic, groups_per_batch=2, pairs_per_group=5, seed=0)
    for b in sampler.epoch(0):
        for group, texts in zip(b.groups, b.texts):
            captions = magic.nodes[group].generalized_captions
            assert set(texts) == set(captions)
            counts = Counter(texts)
            assert max(counts.values()) - min(counts.values()) <= 1


def test_original_texts_are_the_images_own_captions(magic):
    """text_source original: each text is one of its image's own captions."""
    sampler = GroupBatchSampler(magic, groups_per_batch=2, pairs_per_group=4, seed=0, text_source="original")
    for b in sampler.epoch(0):
        for ids, texts in zip(b.image_ids, b.texts):
            for image_id, text in zip(ids, texts):
                assert text in magic.images[image_id].captions
    assert set(sampler.all_texts()) == {c for i in magic.split_ids("train") for c in magic.images[i].captions}


def test_only_available_training_images_are_drawn(magic):
    """Images the cache skipped (unreadable) never enter a batch; a group with none left is not trained."""
    group = magic.groups("train")[0]
    gone = set(magic.images_of(group, "train"))
    available = set(magic.split_ids("train")) - gone
    sampler = GroupBatchSampler(magic, 2, 4, seed=0, available_images=available)
    assert group not in sampler.groups and len(sampler) == 5
    assert sampler.unavailable_images == len(gone)
    for b in sampler.epoch(0):
        assert not gone & {i for row in b.image_ids for i in row}
        assert group not in b.groups


def test_test_images_never_enter_training_batches(magic):
    """Batches hold training-split images only."""
    sampler = GroupBatchSampler(magic, 3, 8, seed=0)
    for b in sampler.epoch(0):
        assert all(magic.images[i].split == "train" for row in b.image_ids for i in row)


def test_bad_params_give_clear_errors(magic):
    """M above the number of groups, missing generalized captions and a bad text source name the fix."""
    with pytest.raises(ValueError, match="groups_per_batch .*exceeds the number of training groups"):
        GroupBatchSampler(magic, groups_per_batch=7, pairs_per_group=2)
    with pytest.raises(ValueError, match="text_source"):
        GroupBatchSampler(magic, 2, 2, text_source="captions")
    bare = tiny_magic()[0]
    bare.nodes["l1:wedding"].generalized_captions = []
    with pytest.raises(ValueError, match="no generalized captions.*text_source: original"):
        GroupBatchSampler(bare, 2, 2)
    GroupBatchSampler(bare, 2, 2, text_source="original")  # the original captions still work


def test_shard_gives_each_rank_whole_contiguous_groups(magic):
    """DDP ranks hold whole groups: concatenating the shards in rank order gives back the batch."""
    batch = GroupBatchSampler(magic, 4, 3, seed=0).batch(0, 2)
    shards = [batch.shard(r, 2) for r in range(2)]
    assert shards[0].groups + shards[1].groups == batch.groups
    assert shards[0].image_ids + shards[1].image_ids == batch.image_ids
    with pytest.raises(ValueError, match="divisible by the number of processes"):
        batch.shard(0, 3)


def test_text_pairs_have_distinct_targets_and_mark_leakage(magic):
    """Pretraining pairs: distinct targets per batch, train captions only; concept names only in with_concepts."""
    names = {n.name for n in magic.nodes.values()}
    free = TextPairSampler(magic, "leakage_free", batch_size=4, seed=0)
    exposed = TextPairSampler(magic, "with_concepts", batch_size=4, seed=0)
    assert not names & set(free.targets)
    assert names <= set(exposed.targets)
    assert free.describe()["exposed_to_eval_strings"] is False
    assert exposed.describe()["exposed_to_eval_strings"] is True
    train_captions = {c for i in magic.split_ids("train") for c in magic.images[i].captions}
    for sampler in (free, exposed):
        for index in range(len(sampler)):
            captions, targets = sampler.batch(0, index)
            assert len(set(targets)) == len(targets) == 4
            assert set(captions) <= train_captions
        assert sampler.batch(1, 0) == sampler.batch(1, 0)


@pytest.mark.parametrize("mode", ["leakage_free", "with_concepts"])
@pytest.mark.parametrize("batch_size", [2, 4, 6])
def test_no_pretraining_batch_holds_two_targets_of_one_group(magic, mode, batch_size):
    """Two targets of one group never meet in a batch (so never act as each other's negatives); each target at
    most once per epoch; every batch is full; a caption comes from the images its target belongs to."""
    sampler = TextPairSampler(magic, mode, batch_size=batch_size, seed=3)
    assert len(sampler) >= 1
    for epoch in range(3):
        seen = []
        for index in range(len(sampler)):
            captions, targets = sampler.batch(epoch, index)
            owners = [sampler.owner[t] for t in targets]
            assert len(targets) == sampler.batch_size and len(set(owners)) == len(owners)
            for caption, target in zip(captions, targets):
                assert caption in sampler.sources[target]
            seen += targets
        assert len(seen) == len(set(seen))
    generalized = {t for g in magic.groups("train") for t in magic.nodes[g].generalized_captions}
    assert sum(1 for t in generalized if sampler.owner[t].startswith("l1:")) == len(generalized)


# ------------------------------------------------------------------------------------ epoch definitions
def per_image_magic():
    """tiny_magic with per-image generalized captions (magic.generalize: image): two of its own per image."""
    magic = tiny_magic(per_group=8)[0]
    magic.generalize = "image"
    for image_id, record in magic.images.items():
        record.generalized_captions = [f"{image_id} generalized a", f"{image_id} generalized b"]
    return magic


@pytest.mark.parametrize("n", [3, 4, 5, 13])
def test_pairs_epoch_covers_every_training_pair_once(n):
    """train.epoch pairs: the anchor chunks of an epoch hold every training (image, own generalized caption) pair
    exactly once, plus only the padding of each group's last chunk (counted); ceil(pairs / N) batches per group."""
    magic = per_image_magic()
    sampler = GroupBatchSampler(magic, groups_per_batch=2, pairs_per_group=n, seed=0, epoch="pairs")
    pairs = {(i, t) for g in magic.groups("train") for i in magic.images_of(g, "train")
             for t in magic.generalized_texts(i)}
    per_group = {g: 2 * len(magic.images_of(g, "train")) for g in magic.groups("train")}
    assert len(sampler) == sum(-(-p // n) for p in per_group.values())
    assert sampler.describe()["training_pairs"] == len(pairs) == 72
    for epoch in range(2):
        anchored: Counter = Counter()
        padding = 0
        for index in range(len(sampler)):
            b = sampler.batch(epoch, index)
            assert b.shape == (2, n)
            anchored.update(zip(b.image_ids[0], b.texts[0]))
            padding += sampler.plan.anchor(epoch, index).padded
            for row_ids, row_texts, group in zip(b.image_ids, b.texts, b.groups):
                for image_id, text in zip(row_ids, row_texts):
                    assert magic.images[image_id].node == group and text in magic.generalized_texts(image_id)
        assert set(anchored) == pairs
        assert sum(anchored.values()) - len(pairs) == padding == sum(-(-p // n) * n - p for p in per_group.values())


def test_pairs_epoch_is_deterministic_and_differs_across_epochs():
    """A batch is a pure function of (seed, epoch, index): two samplers agree; epochs and seeds reorder."""
    magic = per_image_magic()
    a = GroupBatchSampler(magic, 2, 4, seed=5, epoch="pairs")
    b = GroupBatchSampler(magic, 2, 4, seed=5, epoch="pairs")
    assert [a.batch(1, i) for i in range(len(a))] == [b.batch(1, i) for i in reversed(range(len(b)))][::-1]
    assert [a.batch(0, i).texts for i in range(len(a))] != [a.batch(1, i).texts for i in range(len(a))]
    other = GroupBatchSampler(magic, 2, 4, seed=6, epoch="pairs")
    assert [a.batch(0, i).texts for i in range(len(a))] != [other.batch(0, i).texts for i in range(len(a))]


def test_groups_epoch_reads_each_images_own_texts():
    """train.epoch groups with per-image captions: one batch per group, each text one of its image's own; the
    frozen-text table (all_texts) is exactly the training images' texts."""
    magic = per_image_magic()
    sampler = GroupBatchSampler(magic, 2, 4, seed=0, epoch="groups")
    assert len(sampler) == 6 and sampler.epoch_kind == "groups"
    for b in sampler.epoch(0):
        for row_ids, row_texts in zip(b.image_ids, b.texts):
            assert all(t in magic.generalized_texts(i) for i, t in zip(row_ids, row_texts))
    assert sampler.all_texts() == sorted({t for i in magic.split_ids("train") for t in magic.generalized_texts(i)})
    with pytest.raises(ValueError, match="train.epoch must be"):
        GroupBatchSampler(magic, 2, 4, epoch="images")


def test_group_mode_pairs_are_images_with_their_nodes_captions(magic):
    """With node-level captions (magic.generalize: group) a pair is an image with one of its node's captions, so
    a pairs epoch holds (train images x node captions) pairs; the groups epoch keeps today's batches."""
    sampler = GroupBatchSampler(magic, 2, 4, seed=0, epoch="pairs")
    assert sampler.describe()["training_pairs"] == sum(
        len(magic.images_of(g, "train")) * len(magic.nodes[g].generalized_captions) for g in magic.groups("train"))
    groups = GroupBatchSampler(magic, 2, 4, seed=0)
    assert groups.epoch_kind == "groups" and len(groups) == 6
