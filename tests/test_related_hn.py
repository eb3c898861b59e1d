"""Keyword-permuted hard negatives (Rösch et al.): the permuter, the clip_hn loss against its loop reference, a
tiny clip_hn training run, and the keyword-permutation evaluation rows."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest
import torch
from prepared_runs import train_one_prepared
from reference_losses import ref_clip_hn_loss, ref_clip_loss

from cglib.data.permute import KINDS, KeywordPermuter, coco_permuter, cyclic, pairs, synthetic_permuter
from cglib.data.synthetic import make_world
from cglib.losses import clip_hn_loss, clip_loss

COCO_LIKE = ["A white cat under an umbrella.", "Two dogs sitting on top of a red bed.",
             "A hot dog next to an apple on a dining table.", "Large elephants walking left of a tall tree.",
             "People riding bicycles down a street.", "An orange and a banana in a bowl.",
             "A man in front of three small black cars.", "Navy blue skis leaning on a bench."]


def _assert_relations_are_derangements(permuter: KeywordPermuter) -> None:
    for kind in KINDS:
        relation = permuter.relations[kind]
        assert sorted(relation.values()) == sorted(relation), kind  # onto its own vocabulary: a bijection
        assert all(k != v for k, v in relation.items()), kind  # no fixed point


@pytest.mark.parametrize("which", ["synthetic", "coco"])
def test_relations_are_bijections_without_fixed_points(which):
    """Every concept type's relation (synthetic world and the shipped COCO file) maps its vocabulary onto itself
    one to one and moves every keyword; a relation with a fixed point or a stray word is refused."""
    permuter = synthetic_permuter() if which == "synthetic" else coco_permuter()
    _assert_relations_are_derangements(permuter)
    with pytest.raises(ValueError, match="themselves"):
        KeywordPermuter({"colour": {"red": "red"}})
    with pytest.raises(ValueError, match="one-to-one"):
        KeywordPermuter({"colour": {"red": "blue", "blue": "green"}})
    assert cyclic(["a", "b", "c"]) == {"a": "b", "b": "c", "c": "a"}
    assert pairs([["left", "right"]]) == {"left": "right", "right": "left"}


def test_permuted_synthetic_captions_differ_from_the_original_by_one_keyword():
    """Over every caption of a small synthetic world and every keyword occurrence of every type, the permuted
    caption differs from the original, swaps exactly one keyword through the relation, and leaves protected
    setting names alone; the world names no size, so size never permutes."""
    world = make_world(images_per_concept=2, seed=0)
    permuter = synthetic_permuter()
    n_permuted = dict.fromkeys(KINDS, 0)
    for image_id, captions in world.dataset.captions.items():
        setting = world.scenes[image_id].setting
        for caption in captions:
            for kind in KINDS:
                found = permuter.matches(caption, kind)
                for pick, m in enumerate(found):
                    new = permuter.permute(caption, kind, pick)
                    assert new is not None and new != caption, (caption, kind)
                    assert new.endswith(caption[m.end:])
                    target = permuter.relations[kind][m.keyword]
                    word = permuter.surface(kind, target, m.plural)
                    head = new[:len(new) - len(caption) + m.end]
                    assert head.lower().endswith(word)  # the keyword became its image under the relation
                    # the rest before it is unchanged, up to the article agreeing with the new word
                    assert re.sub(r"\b(a|an) $", "", head[:-len(word)].lower()) == \
                        re.sub(r"\b(a|an) $", "", caption[:m.start].lower())
                    n_permuted[kind] += 1
                if not found:
                    assert permuter.permute(caption, kind) is None
                # how the templates name the setting: "in a park.", "a park with ..." (not "a beach umbrella")
                named = re.compile(rf"\b(a|an|the) {setting}(?=[.,]| with| showing| containing)", re.IGNORECASE)
                if kind == "object" and named.search(caption):  # its name ("a baseball field") is kept
                    assert all(named.search(p) for p in (permuter.permute(caption, kind, k) for k in range(len(found))))
    assert n_permuted["size"] == 0 and min(n_permuted[k] for k in ("colour", "object", "location")) > 0


def test_permuter_examples_and_no_keyword():
    """Whole words, longest phrase first, number and capitals kept, a/an corrected; no keyword gives None."""
    coco = coco_permuter()
    assert coco.permute("A white cat under an umbrella.", "colour") == "A red cat under an umbrella."
    assert coco.permute("A white cat under an umbrella.", "location") == "A white cat over an umbrella."
    assert coco.permute("Two dogs sitting on top of a red bed.", "location") == "Two dogs sitting underneath a red bed."
    assert coco.permute("A hot dog next to an apple on a dining table.", "object") == \
        "A pizza next to an apple on a dining table."  # hot dog, not dog
    assert coco.permute("People riding bicycles down a street.", "object", 1) == "People riding cars down a street."
    assert coco.permute("Large elephants walking left of a tall tree.", "size") == \
        "Small elephants walking left of a tall tree."
    assert coco.permute("a scattered catalogue", "object") is None  # no whole-word "cat"
    for caption in COCO_LIKE:
        for kind in KINDS:
            for pick in range(len(coco.matches(caption, kind))):
                assert coco.permute(caption, kind, pick) not in (None, caption)
    assert coco.permute("A man sitting.", "colour") is None and coco.kinds_in("A man sitting.") == []
    syn = synthetic_permuter()
    assert syn.permute("A red balloon above a cake in a living room.", "colour") == \
        "A silver balloon above a cake in a living room."
    assert syn.permute("A navy blue wetsuit near an apple.", "colour") == "An orange wetsuit near an apple."
    assert syn.permute("A balloon near an apple.", "object", 1) == "A balloon near an apple tree."
    assert syn.permute("A balloon next to a cake.", "location") is None  # symmetric relations are no keywords
    assert syn.permute("Two pairs of skis and a cake.", "object") == "Two sneakers and a cake."
    assert syn.permute("An egg and two sneakers.", "object", 1) == "An egg and two snowmans."  # as _plural writes it
    assert syn.permute("A shuttlecock and a cake.", "object") == "A ski pole and a cake."
    assert syn.permute("A ski pole and a cake.", "object") == "A pair of skis and a cake."
    copy = pickle.loads(pickle.dumps(syn))  # as DataLoader workers receive it
    assert copy.permute("A red balloon.", "colour") == "A silver balloon." and copy._cache.keys() <= {("A red balloon.", "colour")}


# ----------------------------------------------------------------------------------------------------- loss
def _hn_case(seed: int, b: int = 8, dim: int = 5, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    image = (2 * torch.randn(b, dim, generator=gen, dtype=dtype)).requires_grad_(True)
    text = torch.randn(b, dim, generator=gen, dtype=dtype).requires_grad_(True)
    hard = (text.detach() + 0.3 * torch.randn(b, dim, generator=gen, dtype=dtype)).requires_grad_(True)
    columns = torch.tensor([(k + 1 + int(torch.randint(b - 1, (1,), generator=gen))) % b for k in range(b)])
    columns[::3] = -1  # some rows without a keyword
    return image, text, hard, columns


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("with_ids", [False, True])
def test_clip_hn_loss_equals_literal_reference(seed, with_ids):
    """clip_hn_loss equals the loop reference in float64 (value and gradients), flat and as (M, N, L), with and
    without identical texts; with no hard negative at all it is clip_loss."""
    image, text, hard, columns = _hn_case(seed)
    ids = torch.tensor([0, 1, 1, 2, 3, 4, 4, 5]) if with_ids else None
    if with_ids:  # the builder never replaces a masked column (an identical text)
        for k in range(8):
            if columns[k] >= 0 and ids[columns[k]] == ids[k]:
                columns[k] = -1
    got = clip_hn_loss(image, text, hard, columns, 0.1, text_ids=ids)
    expected = ref_clip_hn_loss(image, text, hard, columns, 0.1, ids)
    torch.testing.assert_close(got, expected)
    for g, w in zip(torch.autograd.grad(got, (image, text, hard)),
                    torch.autograd.grad(expected, (image, text, hard)), strict=True):
        torch.testing.assert_close(g, w)
    grouped = clip_hn_loss(image.reshape(2, 4, 5), text.reshape(2, 4, 5), hard.reshape(2, 4, 5),
                           columns.reshape(2, 4), 0.1, text_ids=None if ids is None else ids.reshape(2, 4))
    torch.testing.assert_close(grouped, expected)
    none = torch.full_like(columns, -1)
    torch.testing.assert_close(clip_hn_loss(image, text, hard, none, 0.1, text_ids=ids),
                               clip_loss(image, text, 0.1, text_ids=ids))
    torch.testing.assert_close(ref_clip_hn_loss(image, text, hard, none, 0.1, ids), ref_clip_loss(image, text, 0.1, ids))


def test_clip_hn_loss_refuses_bad_columns():
    """A column pointing at the row's own pair, out of range, or of the wrong shape is an error naming it."""
    image, text, hard, columns = _hn_case(0)
    with pytest.raises(ValueError, match="other than the row's own"):
        clip_hn_loss(image, text, hard, torch.arange(8), 0.1)
    with pytest.raises(ValueError, match="other than the row's own"):
        clip_hn_loss(image, text, hard, torch.full((8,), 8), 0.1)
    with pytest.raises(ValueError, match="one column per pair"):
        clip_hn_loss(image, text, hard, columns[:4], 0.1)


# ------------------------------------------------------------------------------------------------- training
KEYWORD_CAPTIONS = ["a red balloon above a cake", "two dogs below a white umbrella", "a green apple near a drum"]


def _magic_with_keywords():
    """tiny_magic whose first caption of every other image names synthetic-world keywords."""
    from factories import tiny_magic

    magic, dataset = tiny_magic()
    for k, (image_id, record) in enumerate(sorted(magic.images.items())):
        if k % 2 == 0:
            captions = [f"{KEYWORD_CAPTIONS[k % 3]} number {k}", *record.captions[1:]]
            magic.images[image_id] = record.model_copy(update={"captions": captions})
            dataset.captions[image_id] = captions
    return magic, dataset


@pytest.mark.parametrize("freeze_text", [True, False])
def test_clip_hn_training_counts_pairs_without_a_keyword(tmp_path, freeze_text):
    """A tiny clip_hn run (frozen text table or trainable tower) trains, and its summary counts every pair of
    every epoch: with a hard negative, without a keyword, as a recount of the same deterministic batches gives."""
    from test_train import make_run

    from cglib.magic.files import save_magic
    from cglib.train.objectives.keyword_negatives import batch_hard_negatives
    from cglib.train.sampler import GroupBatchSampler

    magic, dataset = _magic_with_keywords()
    save_magic(magic, tmp_path / "magic" / "magic.json")
    dataset.save(tmp_path / "captions")
    run = make_run(tmp_path, model={"freeze_text": freeze_text}, epochs=2,
                   runs=[{"name": "hn", "loss": "clip_hn", "text_source": "original"}])
    summary = train_one_prepared(run, "hn", progress=False)
    hn = summary["hard_negatives"]
    assert summary["loss"] == "clip_hn" and np.isfinite(summary["final_loss"])
    assert hn["pairs"] == hn["with_hard_negative"] + hn["pairs_without_keyword"] + hn["pairs_without_other_text"]
    assert hn["with_hard_negative"] > 0 and hn["pairs_without_keyword"] > 0 and len(hn["per_epoch"]) == 2
    assert sum(hn["by_type"].values()) == hn["with_hard_negative"] and hn["by_type"]["size"] == 0
    sampler = GroupBatchSampler(magic, 2, 3, run.train_seed, "original", epoch="groups")
    recount = [h for e in range(2) for b in sampler.epoch(e)
               for h in batch_hard_negatives(b, synthetic_permuter(), run.train_seed)]
    assert hn["pairs"] == len(recount) == summary["images_seen"]
    from cglib.train import summary_table

    assert summary_table({"hn": summary}).loc["hn", "pairs without keyword"] == hn["pairs_without_keyword"]
    assert hn["pairs_without_keyword"] == sum(h.kind is None for h in recount)
    assert summary["precomputed_texts"] == (len(sampler.all_texts()) + len({h.text for h in recount if h.text})
                                            if freeze_text else 0)


# ----------------------------------------------------------------------------------------------- evaluation
def test_keyword_permutation_rows_in_the_evaluation(tmp_path):
    """eval.keyword_permutation adds one i2t accuracy row per concept type and model (chance 0.5) with item
    counts in results.json; images without a keyword of a type are excluded and counted; Table 3 is unchanged."""
    from test_eval_pipeline import make_run

    from cglib.evaluate import evaluate_run
    from cglib.magic.files import save_magic
    from cglib.train import ensure_initial

    run = make_run(tmp_path, runs=[], keyword_permutation=True)
    magic, dataset = _magic_with_keywords()
    save_magic(magic, run.stage("magic") / "magic.json")
    dataset.save(run.stage("captions"))
    ensure_initial(run)
    result = evaluate_run(run, progress=False)
    m = result.metrics
    rows = m[m["benchmark"] == "keyword_permutation"]
    assert set(rows["labels"]) == set(KINDS) and set(rows["direction"]) == {"i2t"}
    assert set(rows["metric"]) == {"accuracy"} and set(rows["level"]) == {"caption"}
    assert (rows["chance"] == 0.5).all()
    per_type = result.info["items"]["keyword_permutation"]["per_type"]
    n_test = result.info["items"]["n_test_images"]
    for kind in KINDS:
        row = rows[rows["labels"] == kind].iloc[0]
        assert per_type[kind]["images"] + per_type[kind]["without_keyword"] == n_test
        assert row["n"] == per_type[kind]["images"]
        assert row["n_excluded"] == per_type[kind]["without_keyword"] * 2  # two eval seeds
    assert per_type["colour"]["images"] > 0 and per_type["size"]["images"] == 0
    colour = rows[rows["labels"] == "colour"].iloc[0]
    assert 0 <= colour["value"] <= 1 and colour["n_queries"] == 2 * per_type["colour"]["images"]
    assert not any("keyword" in str(c) for c in result.table3.columns)


# ---------------------------------------------------------------------------------------------- distributed
def _hn_global(seed: int = 3):
    """A global batch of 12 pairs: features, hard texts, global columns and ids with duplicates across ranks."""
    image, text, hard, columns = _hn_case(seed, b=12)
    ids = torch.tensor([0, 1, 2, 3, 4, 5, 0, 6, 7, 8, 2, 9])
    for k in range(12):
        if columns[k] >= 0 and ids[columns[k]] == ids[k]:
            columns[k] = -1
    return image.detach(), text.detach(), hard.detach(), columns, ids


def _hn_worker(rank: int, port: int, out_dir: str) -> None:
    """One gloo rank: clip_hn_loss on its 6 pairs (columns index the global batch); saves loss and gradients."""
    import os

    import torch.distributed as dist
    import torch.distributed.nn  # gather_groups: differentiable all_gather (training imports it with DDP)

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        image, text, hard, columns, ids = _hn_global()
        part = slice(6 * rank, 6 * rank + 6)
        local = [x[part].clone().requires_grad_(True) for x in (image, text, hard)]
        loss = clip_hn_loss(*local, columns[part], 0.1, text_ids=ids[part])
        loss.backward()
        torch.save({"loss": loss.detach(), "grads": [x.grad for x in local]}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_clip_hn_loss_under_two_processes_equals_one(tmp_path):
    """Under torchrun-like gloo ranks, each rank's clip_hn_loss is the global batch's loss and its local gradients
    are world_size times the single-process ones (the cglib.losses convention)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(_hn_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    image, text, hard, columns, ids = _hn_global()
    inputs = [x.clone().requires_grad_(True) for x in (image, text, hard)]
    single = clip_hn_loss(*inputs, columns, 0.1, text_ids=ids)
    single.backward()
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        torch.testing.assert_close(got["loss"], single.detach())
        for g, x in zip(got["grads"], inputs, strict=True):
            torch.testing.assert_close(g, 2 * x.grad[6 * rank:6 * rank + 6])
