"""The authors' image-text epoch (train.epoch: pairs_as_published) against a literal re-implementation of their
loader path (ai-lab-conf/CLEAR_GLASS src/training/data.py, train.py): TrainConceptDataset, get_dataset's
DataLoader (batch size 1 for training, drop_last), train_collate_fn and train_one_epoch's loop (its `continue` on
an empty item, its slices of M groups of N), given the same shuffle and the same negative draws."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from factories import tiny_magic
from prepared_runs import train_one_prepared

from cglib.magic.files import save_magic
from cglib.train.epochs import PublishedPairsEpoch
from cglib.train.optim import warmup_cosine
from cglib.train.sampler import GroupBatchSampler, epoch_sizes


# ------------------------------------------------------------------------ their code, line by line on the path
class TheirTrainConceptDataset(torch.utils.data.Dataset):
    """data.py TrainConceptDataset: the JSON file is `raw_data`, an image is its id (no pixels, no tokenizer), and
    `random.choices` is `choices(idx, population, k)`, so a test can replay our draws."""

    def __init__(self, raw_data, group_size, batch_size, choices):
        self.batch_size = batch_size
        self.group_size = group_size
        self.raw_data, self.choices = raw_data, choices
        self.data = self._load_data_train()

    def _load_data_train(self):
        raw_data = self.raw_data
        processed_data_initial = []
        for concept_data in raw_data:
            if len(concept_data.get('hard_negative', [])) < self.batch_size - 1:
                continue
            concept_captions = []
            images = concept_data['train_images']
            for image_data in images:
                image_id = image_data.get('image')
                if not image_id:
                    continue
                for caption in image_data.get('new_captions', []):
                    if caption:
                        concept_captions.append({"image_id": image_id, "caption": caption})
            for i in range(0, len(concept_captions), self.group_size):
                if i + self.group_size <= len(concept_captions):
                    group = {"hard_negatives": concept_data.get('hard_negative', []),
                             "concept": concept_data.get('concept', ''),
                             "items": concept_captions[i:i + self.group_size]}
                    if len(group["items"]) == self.group_size and len(group["hard_negatives"]) >= self.batch_size - 1:
                        processed_data_initial.append(group)
        concept_lookup = {group['concept']: group for group in processed_data_initial if group['concept']}
        processed_data = []
        for group in processed_data_initial:
            valid_hard_negatives = [hard_neg for hard_neg in group['hard_negatives'] if hard_neg in concept_lookup]
            group['hard_negatives'] = valid_hard_negatives
            if len(valid_hard_negatives) >= self.batch_size - 1:
                processed_data.append(group)
        return processed_data

    def __len__(self):
        return len(self.data)

    def _process_group_items(self, group):
        images = [item['image_id'] for item in group["items"]]
        captions = [item['caption'] for item in group["items"]]
        return images, captions

    def __getitem__(self, idx):
        group = self.data[idx]
        if len(group["hard_negatives"]) < self.batch_size - 1:
            return [], []
        images, captions = self._process_group_items(group)
        hard_negatives = self.choices(idx, group["hard_negatives"], self.batch_size - 1)
        batch_images = []
        batch_captions = []
        batch_images.append(images)
        batch_captions.append(captions)
        for hard_negative in hard_negatives:
            hard_negative_group = None
            for other_group in self.data:
                if hard_negative == other_group["concept"]:
                    hard_negative_group = other_group
                    break
            if hard_negative_group is None:
                return [], []
            else:
                other_group_images, other_group_captions = self._process_group_items(hard_negative_group)
                batch_images.append(other_group_images)
                batch_captions.append(other_group_captions)
        return batch_images, batch_captions


def train_collate_fn(batch):
    """data.py train_collate_fn (ids and strings: nothing to stack)."""
    images_batch = []
    captions_batch = []
    for images, captions in batch:
        for idx, image in enumerate(images):
            images_batch.extend(images[idx])  # noqa: PLR1736 (their line, kept as written)
            captions_batch.extend(captions[idx])
    return images_batch, captions_batch


def their_dataloader(dataset, args, dataset_type, order):
    """get_dataset's DataLoader; its shuffle (a RandomSampler on torch's global RNG) given as a fixed `order`."""
    data_loader_batch_size = args["batch_size"]
    if dataset_type == "train":
        data_loader_batch_size = 1
    return torch.utils.data.DataLoader(dataset, batch_size=data_loader_batch_size, sampler=list(order),
                                       num_workers=0, drop_last=True, collate_fn=train_collate_fn)


def their_epoch(dataloader, args):
    """train.py train_one_epoch: per loader batch, the M groups of N it trains on (as (image, caption) pairs), or
    None where it skips the step (`continue`: their scheduler has already set the step's lr)."""
    steps = []
    for i, batch in enumerate(dataloader):
        batch_images, batch_captions = batch
        if len(batch_captions) == 0:
            steps.append(None)
            continue
        groups = []
        for group_idx in range(args["batch_size"]):
            start_idx = group_idx * args["group_size"]
            end_idx = start_idx + args["group_size"]
            groups.append(list(zip(batch_images[start_idx:end_idx], batch_captions[start_idx:end_idx], strict=True)))
        steps.append(groups)
    return steps


def their_json(magic):
    """What their training JSON holds of a MAGIC file: per concept its hard negatives as listed and its train
    images with their generalized captions, in data order."""
    return [{"concept": g, "hard_negative": magic.negatives(g, include_fallback=False),
             "train_images": [{"image": i, "new_captions": magic.generalized_texts(i)}
                              for i in magic.images_of(g, "train")]} for g in magic.groups("train")]


# ---------------------------------------------------------------------------------------------------- worlds
def world(hard: str, m: int):
    """tiny_magic (six l1 concepts, 9 train images of 2 captions each) with hard negatives:
    siblings: each concept's one sibling (as built); crossed: every other concept;
    dropped: concepts their code keeps in its lookup but drops, which others draw (their item comes back empty),
    and one concept with no listed negative, out of the lookup, that another lists."""
    magic, dataset = tiny_magic(per_group=12)
    l1 = [node.id for node in magic.nodes_at(1)]
    outsider = magic.nodes_at(2)[0].id  # listed as a hard negative, never a training concept
    if hard == "crossed":
        lists = {g: [o for o in l1 if o != g] for g in l1}
    elif hard == "dropped" and m == 2:
        lists = {l1[0]: [outsider], l1[1]: [l1[0], l1[2]], l1[2]: [l1[1]], l1[3]: [l1[0]], l1[4]: [],
                 l1[5]: [l1[4], l1[2]]}
    elif hard == "dropped" and m == 3:
        lists = {g: [o for o in l1 if o != g] for g in l1}
        lists[l1[0]] = [l1[1], outsider]
    else:
        lists = {g: magic.nodes[g].hard_negatives for g in l1}
    for g, negatives in lists.items():
        magic.nodes[g].hard_negatives = negatives
    return magic, dataset


@pytest.mark.parametrize(("m", "n", "hard"), [(2, 5, "siblings"), (2, 12, "siblings"), (3, 4, "crossed"),
                                              (3, 7, "crossed"), (2, 5, "dropped"), (2, 3, "dropped"),
                                              (3, 4, "dropped"), (3, 6, "dropped")])
def test_the_authors_epoch_gives_the_same_batches_for_the_same_draws(m, n, hard):
    """Every step of ours against their loader's, batch for batch: the same anchor chunk, the same negative chunks,
    the same skipped steps; as many steps as chunks (their loader's batch size is 1)."""
    magic, _ = world(hard, m)
    seed, epoch = 3, 1
    sampler = GroupBatchSampler(magic, m, n, seed, epoch="pairs_as_published")
    order = np.random.default_rng([seed, epoch, 5]).permutation(len(sampler.plan.items))  # the sampler's shuffle
    position = {int(idx): k for k, idx in enumerate(order)}

    def choices(idx, population, k):  # the sampler's own draw for the step that holds item idx, replayed
        draws = np.random.default_rng([seed, epoch, position[idx], 1]).integers(len(population), size=k)
        return [population[i] for i in draws]

    args = {"batch_size": m, "group_size": n}
    dataset = TheirTrainConceptDataset(their_json(magic), n, m, choices)
    theirs = their_epoch(their_dataloader(dataset, args, "train", order), args)
    ours = [sampler.batch(epoch, k) for k in range(len(sampler))]

    assert len(ours) == len(theirs) == len(dataset) > 0
    for k, (batch, step) in enumerate(zip(ours, theirs, strict=True)):
        assert batch.anchor == dataset.data[order[k]]["concept"]
        assert batch.empty == (step is None)
        if step is not None:
            assert [list(zip(i, t, strict=True)) for i, t in zip(batch.image_ids, batch.texts, strict=True)] == step
            assert not batch.used_fallback and batch.repeated_images == 0
    empty = sum(batch.empty for batch in ours)
    if hard == "dropped":  # both kinds of step occur
        assert 0 < empty < len(ours)
    else:
        assert empty == 0
    assert sampler.plan.dropped["anchors_that_can_come_back_empty"] >= empty


def test_what_the_authors_epoch_leaves_out_is_counted():
    """Incomplete chunks, concepts without M-1 hard negatives in the lookup, and the anchors that can come back
    empty (with how many steps an epoch is expected to skip), each counted; every complete chunk of a kept concept
    is a step; with replacement a batch can hold one negative concept twice."""
    ten = [(f"x{i}", "t") for i in range(10)]
    pairs = {"A": [(f"a{i}", "t") for i in range(25)], "B": [(f"b{i}", "t") for i in range(10)],
             "C": [(f"c{i}", "t") for i in range(7)], "D": [(f"d{i}", "t") for i in range(30)],
             "E": ten, "F": ten, "G": ten}
    hard = {"A": ["C", "B"], "B": ["A"], "C": ["A"], "D": ["C"], "E": ["D"], "F": [], "G": ["F", "A"]}
    plan = PublishedPairsEpoch(pairs, 10, 2, hard, seed=0)
    # C has no complete chunk; D's only hard negative is C; F lists none, so G cannot draw it
    assert plan.kept == ["A", "B", "E", "G"] and plan.valid["G"] == ["A"] and plan.valid["E"] == ["D"]
    assert [g for g, _ in plan.items] == ["A", "A", "B", "E", "G"] and len(plan) == 5
    assert plan.dropped == {"pairs_in_incomplete_chunks": 5 + 7, "concepts_without_m_minus_1_hard_negatives": 2,
                            "anchors_that_can_come_back_empty": 1, "expected_empty_steps_per_epoch": 1.0}
    assert plan.first_chunk["A"] == pairs["A"][:10] and not plan.has_item("D")
    three = PublishedPairsEpoch({g: [(f"{g}{i}", "t") for i in range(10)] for g in "PQRS"}, 10, 3,
                                {g: [h for h in "PQRS" if h != g] for g in "PQRS"}, seed=0)
    draws = [three.negatives("P", np.random.default_rng(s)) for s in range(30)]
    assert any(a == b for a, b in draws) and all("P" not in d for d in draws)


def test_the_authors_epoch_trains_and_reports_its_size(tmp_path):
    """A run with train.epoch: pairs_as_published trains (its summary says so) and epoch_sizes lists it; a world too
    small for it is an error naming the fix, and 0 in epoch_sizes."""
    from test_train import make_run



    magic, _ = tiny_magic(per_group=12)
    sizes = epoch_sizes(magic, 2, 5)
    assert sizes["pairs_as_published"] == len(GroupBatchSampler(magic, 2, 5, 0, epoch="pairs_as_published")) > 0
    assert sizes["pairs_as_published"] == 6 * (18 // 5)  # every complete chunk, whatever M
    assert epoch_sizes(magic, 2, 500)["pairs_as_published"] == 0
    with pytest.raises(ValueError, match="keeps no batch.*lower pairs_per_group"):
        GroupBatchSampler(magic, 2, 500, 0, epoch="pairs_as_published")
    run = make_run(tmp_path, epoch="pairs_as_published", runs=[{"name": "p", "loss": "pairwise"}])
    summary = train_one_prepared(run, "p", progress=False)
    assert summary["steps"] > 0 and summary["epoch_kind"] == "pairs_as_published" and summary["empty_steps"] == 0


def _final_and_log(run_dir):
    from safetensors.torch import load_file

    rows = list(csv.DictReader((run_dir / "training/p/log.csv").open(encoding="utf-8")))
    keys = ("phase", "epoch", "step", "global_step", "loss", "lr", "grad_norm", "skipped", "empty")
    return load_file(str(run_dir / "training/p/final.safetensors")), [[r[k] for k in keys] for r in rows]


def world_with_empty_steps():
    """A valid MAGIC file (hard negatives symmetric) where, at M = 3 and N = 3, their lookup holds a concept it
    then drops (one of its two hard negatives has no complete chunk) and a kept concept lists it."""
    magic, dataset = tiny_magic()
    a, b, c, d, e, f = (node.id for node in magic.nodes_at(1))
    for g, negatives in {a: [b, f], b: [a, c, d], c: [b, d], d: [b, c], e: [], f: [a]}.items():
        magic.nodes[g].hard_negatives = negatives
        magic.nodes[g].negative_similarity = dict.fromkeys(negatives, 0.9)
    for image in magic.images_of(f, "train")[1:]:  # f keeps one train image: 2 pairs, no chunk of 3
        magic.images[image].split = "test"
    return magic, dataset


def test_empty_steps_are_skipped_counted_and_resume_exactly(tmp_path):
    """On a world whose drawn negatives can be dropped concepts, an empty step changes no weight, passes its
    schedule position, is counted in the summary and the log; a run interrupted right after one and resumed ends
    with exactly the weights and log of an uninterrupted run."""
    from test_train import _interrupt_at, make_run



    def prepared(directory):
        magic, dataset = world_with_empty_steps()
        save_magic(magic, directory / "magic" / "magic.json")
        dataset.save(directory / "captions")
        return make_run(directory, epoch="pairs_as_published", groups_per_batch=3, pairs_per_group=3,
                        runs=[{"name": "p", "loss": "pairwise"}])

    whole = prepared(tmp_path / "whole")
    rows = []
    summary = train_one_prepared(whole, "p", progress=False, on_step=rows.append)
    sampler = GroupBatchSampler(world_with_empty_steps()[0], 3, 3, whole.train_seed, epoch="pairs_as_published")
    expected = [sampler.batch(e, k).empty for e in range(2) for k in range(len(sampler))]
    assert summary["steps"] == 2 * len(sampler) == 2 * summary["steps_per_epoch"]
    assert summary["empty_steps"] == sum(expected) > 0 and summary["skipped_steps"] == 0
    assert [bool(r["empty"]) for r in rows] == expected
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-3)  # the run's train.lr
    schedule = warmup_cosine(optimizer, summary["warmup_steps_used"]["train"], summary["steps"])
    lrs = []
    for _ in rows:  # one schedule position per step, empty ones included (their loop's scheduler(step))
        lrs.append(schedule.get_last_lr()[0])
        optimizer.step()
        schedule.step()
    assert [r["lr"] for r in rows] == pytest.approx(lrs)
    assert all(np.isnan(r["loss"]) for r in rows if r["empty"]) and all(np.isfinite(r["loss"]) for r in rows
                                                                        if not r["empty"])

    parts = prepared(tmp_path / "parts")
    first_empty = next(r["global_step"] for r in rows if r["empty"] and r["global_step"] > 1)
    with pytest.raises(KeyboardInterrupt):
        train_one_prepared(parts, "p", progress=False, on_step=_interrupt_at(first_empty))
    resumed = train_one_prepared(parts, "p", progress=False)
    assert resumed["resumed_from_step"] == first_empty and resumed["empty_steps"] == summary["empty_steps"]
    (a, log_a), (b, log_b) = _final_and_log(whole.dir), _final_and_log(parts.dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert log_a == log_b
    assert json.loads((parts.dir / "training/p/summary.json").read_text())["empty_steps"] == sum(expected)
