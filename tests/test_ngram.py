"""N-gram concept groups (cglib.magic.ngram): mining rules on planted captions, the written file, its cache."""

from __future__ import annotations

import numpy as np
import pytest

from cglib.config import Params, ParamsError, parse_params
from cglib.magic.files import load_magic, save_magic
from cglib.magic.ngram import (
    SKIP_TEST,
    SKIP_UNCOVERED,
    attach_images,
    build_ngram_groups,
    caption_ngrams,
    mine_ngrams,
    ngram_path,
    ngram_table,
)
from cglib.magic.schema import SCHEMA_VERSION, ImageRecord, MagicFile, Node
from cglib.run import RunContext

# train images by caption; min_images 3, n_max 2, max_document_fraction 0.5 of 17 train images (limit 8.5)
PLANTED = [("a red balloon and a photo", 5), ("a balloon and a photo", 3), ("a green cake and a photo", 4),
           ("a blue kite and a photo", 2), ("a blue cake", 2), ("a photo", 1)]
TEST_CAPTION = ("a zebra and a photo", 3)  # test images: shared by 3, but never mined
SETTINGS = {"magic": {"size_min": 3}, "ngram": {"n_max": 2, "max_document_fraction": 0.5}}


def planted_magic() -> MagicFile:
    """A MAGIC file (one l1 node, one level) whose images carry the planted captions; the zebras are test images."""
    images, k = {}, 0
    for caption, count in [*PLANTED, TEST_CAPTION]:
        for _ in range(count):
            image_id = f"i{k:02d}"
            split = "test" if caption == TEST_CAPTION[0] else "train"
            images[image_id] = ImageRecord(id=image_id, node="l1:scene", captions=[caption], split=split)
            k += 1
    nodes = {"l1:scene": Node(id="l1:scene", level=1, name="scene", n_images=len(images))}
    return MagicFile(schema_version=SCHEMA_VERSION, l_max=1, split_kind="image", nodes=nodes, images=images)


def by_last_word(texts: list[str]) -> np.ndarray:
    """A fake concept embedder: one-hot of the last word, so 'red balloon' and 'balloon' have cosine 1."""
    vocabulary = sorted({t.split()[-1] for t in texts})
    out = np.zeros((len(texts), len(vocabulary)), dtype=np.float32)
    for row, text in enumerate(texts):
        out[row, vocabulary.index(text.split()[-1])] = 1.0
    return out


def ids(first: int, count: int) -> list[str]:
    return [f"i{k:02d}" for k in range(first, first + count)]


def test_caption_ngrams_skip_stop_words():
    """Only runs of consecutive non-stop words are n-grams, up to n_max words, lower-cased."""
    stop = frozenset({"a", "in", "the"})
    assert caption_ngrams("A red balloon in the Living room", 3, stop) == {
        "red", "balloon", "red balloon", "living", "room", "living room"}
    assert caption_ngrams("big red balloon", 2, stop) == {"big", "red", "balloon", "big red", "red balloon"}


def test_mining_a_planted_caption_set_gives_exactly_the_expected_groups():
    """Stop words never enter an n-gram, 'photo' (in 15 of 17 images) is too frequent, n-grams below 3 images are
    too rare, identical image sets are one group named by the longest n-gram, test captions are never mined."""
    magic = planted_magic()
    train = {i: magic.images[i].captions for i in magic.split_ids("train")}
    mined = mine_ngrams(train, n_max=2, min_images=3, max_document_fraction=0.5, stop_words=frozenset({"a", "and"}))
    assert mined.groups == {"balloon": ids(0, 8), "red balloon": ids(0, 5), "cake": ids(8, 4) + ids(14, 2),
                            "green cake": ids(8, 4), "blue": ids(12, 4)}
    assert mined.too_frequent == {"photo": 15}
    assert mined.aliases == {"green cake": ["green"], "red balloon": ["red"]}
    assert mined.too_rare == 3  # kite, blue kite, blue cake (2 images each)
    assert mined.candidates == 11


def test_each_image_gets_its_rarest_group_and_small_groups_give_theirs_back():
    """Rule 3: groups take their images rarest first (ties: the longer n-gram); a group left with fewer than
    min_images untaken images takes none (here 'cake': 'green cake' and 'blue' took all of its images)."""
    groups = {"balloon": ids(0, 8), "red balloon": ids(0, 5), "cake": ids(8, 4) + ids(14, 2),
              "green cake": ids(8, 4), "blue": ids(12, 4)}
    attached, removed = attach_images(groups, min_images=3)
    assert removed == ["cake"]
    expected = {**dict.fromkeys(ids(0, 5), "red balloon"), **dict.fromkeys(ids(5, 3), "balloon"),
                **dict.fromkeys(ids(8, 4), "green cake"), **dict.fromkeys(ids(12, 4), "blue")}
    assert attached == expected
    # with min_images 4 'balloon' (3 images left by 'red balloon') takes none: those 3 images are uncovered
    attached, removed = attach_images(groups, min_images=4)
    assert removed == ["cake", "balloon"] and not set(ids(5, 3)) & set(attached)


def test_build_ngram_groups_writes_a_valid_nested_file(tmp_path):
    """The written magic/ngram.json loads with load_magic (schema and DAG invariants): l1 groups by rule 3, levels
    by nesting ('red balloon' under 'balloon', a root repeated above), hard negatives by the embedder, every
    train image covered or counted, test images left out and counted, original captions, no generalized ones."""
    run = RunContext(params=Params.model_validate(SETTINGS), dir=tmp_path)
    save_magic(planted_magic(), tmp_path / "magic" / "magic.json")
    built = build_ngram_groups(run, embedder=by_last_word)
    magic = load_magic(ngram_path(run))
    assert magic.model_dump(exclude={"provenance"}) == built.model_dump(exclude={"provenance"})
    assert magic.l_max == 2
    assert [n.name for n in magic.nodes_at(1)] == ["balloon", "blue", "green cake", "red balloon"]
    assert [n.name for n in magic.nodes_at(2)] == ["balloon", "blue", "cake"]
    assert magic.chain_names("i00") == ["red balloon", "balloon"]
    assert magic.chain_names("i05") == ["balloon", "balloon"]
    assert magic.chain_names("i08") == ["green cake", "cake"]
    assert magic.images_of("l2:balloon") == ids(0, 8)
    assert magic.nodes["l1:red balloon"].hard_negatives == ["l1:balloon"]  # same last word: cosine 1
    assert magic.nodes["l1:blue"].hard_negatives == []
    assert set(magic.images) == set(ids(0, 16))  # i16 ('a photo' only) has no group; the zebras are test
    assert magic.skipped == {SKIP_TEST: 3, SKIP_UNCOVERED: 1}
    assert all(r.split == "train" and not r.generalized_captions for r in magic.images.values())
    assert magic.images["i00"].captions == ["a red balloon and a photo"]
    stats = magic.stats["ngram"]
    assert stats["images_covered"] + stats["images_without_group"] == stats["train_images"] == 17
    assert stats["too_frequent"] == {"photo": 15} and stats["removed_from_l1"] == ["cake"]
    assert "zebra" not in {n.name for n in magic.nodes.values()}
    table = ngram_table(magic)
    assert list(table["ngram"]) == ["red balloon", "blue", "green cake", "balloon"]


def test_the_file_is_reused_until_magic_or_settings_change(tmp_path):
    """A second call reuses magic/ngram.json; changed ngram settings rebuild it."""
    run = RunContext(params=Params.model_validate(SETTINGS), dir=tmp_path)
    save_magic(planted_magic(), tmp_path / "magic" / "magic.json")
    build_ngram_groups(run, embedder=by_last_word)
    stamp = ngram_path(run).stat().st_mtime_ns
    build_ngram_groups(run, embedder=by_last_word)
    assert ngram_path(run).stat().st_mtime_ns == stamp
    wider = RunContext(params=Params.model_validate({**SETTINGS, "ngram": {"n_max": 1, "max_document_fraction": 0.5}}),
                       dir=tmp_path)
    rebuilt = build_ngram_groups(wider, embedder=by_last_word)
    assert rebuilt.stats["ngram"]["settings"]["n_max"] == 1 and rebuilt.l_max == 1


def test_nothing_to_mine_is_a_clear_error(tmp_path):
    """When no n-gram is shared by enough images the error names the settings to change."""
    run = RunContext(params=Params.model_validate({"magic": {"size_min": 50}}), dir=tmp_path)
    save_magic(planted_magic(), tmp_path / "magic" / "magic.json")
    with pytest.raises(ValueError, match="lower ngram.min_images"):
        build_ngram_groups(run, embedder=by_last_word)


def test_ngram_runs_need_original_captions_and_keep_old_specs(tmp_path):
    """groups: ngram with generalized captions is refused naming the fix; at their defaults the new run keys
    (groups) and train keys (mcc_*) leave an existing run's spec unchanged."""
    from cglib.train.inputs import run_entry, run_spec

    with pytest.raises(ParamsError, match="set its text_source: original"):
        parse_params({"train": {"runs": [{"name": "ng", "loss": "clip", "groups": "ngram"}]}}, tmp_path)
    with pytest.raises(ParamsError, match="set pretrain: none"):
        parse_params({"train": {"text_source": "original", "runs": [
            {"name": "ng", "loss": "clip", "groups": "ngram", "pretrain": "leakage_free"}]}}, tmp_path)
    params = parse_params({"train": {"runs": [{"name": "clip", "loss": "clip"}, {"name": "m", "loss": "mcc"}]}},
                          tmp_path)
    clip = run_spec(params, run_entry(params, "clip"))
    assert "groups" not in clip["run"]  # the default leaves the spec as it was
    assert clip["run"]["options"] == {"logit_scale": "fixed"}  # clip's own option, resolved by run.protocol
    assert run_spec(params, run_entry(params, "m"))["run"]["options"] == {"weight": 1.0, "hidden": None}
