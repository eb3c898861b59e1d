"""RE training items: the HierarCaps train file (skips counted, errors naming the fix) and items from a MAGIC DAG."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from factories import tiny_magic, two_top_magic

from cglib.data.coco import CaptionFileError
from cglib.data.hierarcaps_train import REItem, load_hierarcaps_train
from cglib.magic.re_items import re_items_from_magic
from cglib.magic.schema import MagicFile, node_id


def write_gz(path: Path, text: str) -> Path:
    path.write_bytes(gzip.compress(text.encode("utf-8")))
    return path


GOOD = '"a => b => c => a  dog\trunning","x => y => z => a cat"\n'


def test_load_counts_every_skip_reason(tmp_path: Path) -> None:
    """Good rows become REItems (whitespace normalized); bad rows are skipped and counted per reason."""
    rows = [GOOD,
            '"a => b => c","x => y => z => w"\n',  # three positive tiers
            '"a => b => c => d","x => y => z => w => v"\n',  # five negative tiers
            '"a =>  => c => d","x => y => z => w"\n',  # an empty tier
            '"a => b => c => d"\n',  # no negative field
            GOOD]
    items, skipped = load_hierarcaps_train(write_gz(tmp_path / "t.csv.gz", "positive,negative\n" + "".join(rows)))
    assert items == [REItem(("a", "b", "c", "a dog running"), ("x", "y", "z", "a cat"))] * 2
    assert skipped == {"wrong number of tiers": 2, "empty tier": 1, "missing column": 1}
    limited, _ = load_hierarcaps_train(tmp_path / "t.csv.gz", limit=1)
    assert len(limited) == 1


def test_load_errors_name_file_and_fix(tmp_path: Path) -> None:
    """A missing file, a missing column, a non-gzip file or no usable row raise errors naming the file and fix."""
    fix = "cglib download hierarcaps-train --dest DIR"
    with pytest.raises(FileNotFoundError, match=f"not found: .*nope.csv.gz; .*{fix}"):
        load_hierarcaps_train(tmp_path / "nope.csv.gz")
    bad_header = write_gz(tmp_path / "h.csv.gz", "positive,captions\n" + GOOD)
    with pytest.raises(CaptionFileError, match=f"h.csv.gz: no column 'negative' .*{fix}"):
        load_hierarcaps_train(bad_header)
    plain = tmp_path / "p.csv.gz"
    plain.write_text("positive,negative\n" + GOOD, encoding="utf-8")
    with pytest.raises(CaptionFileError, match=f"p.csv.gz is not a readable gzip-compressed UTF-8 CSV .*{fix}"):
        load_hierarcaps_train(plain)
    empty = write_gz(tmp_path / "e.csv.gz", 'positive,negative\n"a => b","c => d"\n')
    with pytest.raises(ValueError, match="no usable row .*wrong number of tiers"):
        load_hierarcaps_train(empty)
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        load_hierarcaps_train(bad_header, limit=0)
    with pytest.raises(ValueError, match="K >= 2 positives and as many negatives"):
        REItem(("a", "b"), ("c",))


def re_magic() -> MagicFile:
    """tiny_magic with a second top-level node `recreation` over `leisure`: every negative source is exercised.

    l4 human activity / recreation (siblings at the top); l3 social gathering (no sibling, hard negative
    leisure) and leisure (no sibling, no hard negative: fallback); l2 celebration / meal siblings, sport alone
    (fallback); l1 pairs of siblings.
    """
    magic = two_top_magic()
    magic.nodes[node_id(3, "social gathering")].hard_negatives = [node_id(3, "leisure")]
    return magic


def test_magic_items_negatives_off_chain_and_sources() -> None:
    """Positives are l4..l1 names then an own caption; each negative is a same-level name off the chain,
    a sibling where one exists; the caption negative is another same-l1 image's caption of the split."""
    magic = re_magic()
    items, counts = re_items_from_magic(magic, seed=3)
    train = magic.split_ids("train")
    assert len(items) == len(train) and all(len(item.positives) == magic.l_max + 1 for item in items)
    level_names = {level: {n.name for n in magic.nodes_at(level)} for level in range(1, 5)}
    for item, image_id in zip(items, train, strict=True):
        record = magic.images[image_id]
        assert list(item.positives[:-1]) == magic.chain_names(image_id)[::-1]
        assert item.positives[-1] in record.captions
        assert not set(item.negatives) & set(item.positives)
        for depth, negative in enumerate(item.negatives[:-1]):
            assert negative in level_names[magic.l_max - depth]
        owner = next(i for i in train if item.negatives[-1] in magic.images[i].captions)
        assert owner != image_id and magic.images[owner].node == record.node
    by_chain = {item.positives[1]: item.negatives[1] for item in items}  # l3 tier
    assert by_chain == {"social gathering": "leisure", "leisure": "social gathering"}
    sport = [item for item in items if item.positives[2] == "sport"]
    assert {item.negatives[2] for item in sport} <= {"celebration", "meal"}
    celebration = [item for item in items if item.positives[2] == "celebration"]
    assert {item.negatives[2] for item in celebration} == {"meal"}  # its only sibling
    tennis = [item for item in items if item.positives[3] == "tennis match"]
    assert {item.negatives[3] for item in tennis} == {"ski trip"}
    n = len(items)
    n_social = sum(item.positives[1] == "social gathering" for item in items)
    assert counts == {"negative: sibling": n + 0 + (n - len(sport)) + n,  # l4, l3 none, l2 but sport, l1
                      "negative: hard negative": n_social, "negative: fallback": (n - n_social) + len(sport),
                      "negative: same-l1 caption": n}


def test_magic_items_deterministic_and_split() -> None:
    """Same seed, same items; another seed draws other negatives; the test split uses only test images'
    captions; captions_per_image gives one item per distinct own caption."""
    magic = re_magic()
    assert re_items_from_magic(magic, seed=1) == re_items_from_magic(magic, seed=1)
    assert re_items_from_magic(magic, seed=1)[0] != re_items_from_magic(magic, seed=2)[0]
    test_items, _ = re_items_from_magic(magic, split="test")
    test_captions = {c for i in magic.split_ids("test") for c in magic.images[i].captions}
    assert len(test_items) == len(magic.split_ids("test"))
    assert all(item.positives[-1] in test_captions and item.negatives[-1] in test_captions for item in test_items)
    two, counts = re_items_from_magic(magic, captions_per_image=5)
    assert len(two) == 2 * len(magic.split_ids("train"))  # every tiny_magic image has two captions
    assert counts["negative: same-l1 caption"] == len(two)
    with pytest.raises(ValueError, match="split must be 'train' or 'test'"):
        re_items_from_magic(magic, split="val")
    with pytest.raises(ValueError, match="captions_per_image must be a positive integer"):
        re_items_from_magic(magic, captions_per_image=0)


def test_magic_items_skip_reasons() -> None:
    """A single top-level node has no negative (image skipped, counted); an l1 node with one image of the
    split borrows a hard-negative node's caption; an image without captions is skipped."""
    magic, _ = tiny_magic()  # one l4 node: nothing to contrast the top tier with
    items, counts = re_items_from_magic(magic)
    assert items == [] and counts == {"skipped: no negative at level 4": len(magic.split_ids("train"))}
    dropped, counts = re_items_from_magic(magic, single_top="drop")  # the top tier left out instead
    assert len(dropped) == len(magic.split_ids("train")) and {len(i.positives) for i in dropped} == {4}
    assert counts["dropped top tier: a single top-level node"] == len(dropped)
    assert all(i.positives[0] in ("social gathering", "leisure") for i in dropped)
    assert all(i.negatives[0] in ("social gathering", "leisure") and i.negatives[0] != i.positives[0]
               for i in dropped)  # the l3 negative: a sibling under the dropped top node
    magic = re_magic()
    wedding = magic.images_of(node_id(1, "wedding"), "train")
    for image_id in wedding[1:]:
        magic.images[image_id].split = "test"
    magic.images[magic.split_ids("train")[0]].captions = []
    items, counts = re_items_from_magic(magic)
    assert counts["skipped: no captions"] == 1 and counts["negative: hard-negative caption"] == 1
    (item,) = [item for item in items if item.positives[-1] in magic.images[wedding[0]].captions]
    birthday = magic.images_of(node_id(1, "birthday party"), "train")
    assert any(item.negatives[-1] in magic.images[i].captions for i in birthday)
