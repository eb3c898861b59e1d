"""MAGIC as a Hugging Face dataset (issue #18): `cglib export-magic` writes the `datasets` layout, `datasets` loads
it, `magic.source` imports it into a fresh run (same magic.json up to provenance, same Table 3), and a corrupt or
incomplete export is refused with a message naming the file and the problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from cglib.cli import main as cli_main
from cglib.config import Params, ParamsError, parse_params
from cglib.data.dataset import CaptionDataset, load_ground_truth
from cglib.magic.files import load_magic, save_magic
from cglib.magic.hf_export import CARD_FILE, NODES_FILE, SPLIT_FILES, export_magic
from cglib.magic.hf_import import ExportError, captions_from_export, read_export, resolve_source
from tests.factories import tiny_magic


def without_provenance(magic) -> dict:
    return magic.model_dump(mode="json", exclude={"provenance"})


@pytest.fixture(scope="module")
def exported(small_run, tmp_path_factory) -> Path:
    """The shared small run's MAGIC exported by the command line."""
    dest = tmp_path_factory.mktemp("export") / "magic"
    assert cli_main(["export-magic", str(small_run), str(dest)]) == 0
    return dest


def test_export_loads_with_datasets_and_holds_the_whole_magic_json(small_run, exported):
    """`load_dataset(DEST)` and `load_dataset("parquet", data_dir=DEST)` give the train and test splits with one row
    per image; the nodes table loads as its own config; reading the export back gives magic.json's content."""
    import datasets

    magic = load_magic(small_run / "magic" / "magic.json")
    for loaded in (datasets.load_dataset(str(exported)), datasets.load_dataset("parquet", data_dir=str(exported))):
        assert sorted(loaded) == ["test", "train"]
        for split in ("train", "test"):
            assert sorted(loaded[split]["image_id"]) == magic.split_ids(split)
        row = loaded["test"][0]
        assert row["split"] == "test" and row["captions"] == magic.images[row["image_id"]].captions
        assert [row[f"l{k}_node"] for k in range(1, 5)] == magic.chain(row["image_id"])
        assert [row[f"l{k}"] for k in range(1, 5)] == magic.chain_names(row["image_id"])
        assert row["hard_negative_nodes"] == magic.nodes[row["l1_node"]].hard_negatives
        assert row["ground_truth"] is not None and row["file_name"] is None  # a synthetic world: no files
    nodes = datasets.load_dataset(str(exported), "nodes", split="nodes")
    assert sorted(nodes["id"]) == sorted(magic.nodes)

    card = (exported / CARD_FILE).read_text()
    assert "No image is included" in card and "load_dataset" in card
    info = yaml.safe_load(card.split("\n---\n")[0].removeprefix("---\n"))["cglib_magic"]
    assert info["world"]["seed"] == 0 and info["world"]["images_per_concept"] == 8
    assert info["built_by"]["llm_backend"] == "offline" and info["built_by"]["prompt_version"] == "v1"
    assert info["table1"]["l1 nodes"] == len(magic.nodes_at(1))
    assert without_provenance(read_export(exported).magic) == without_provenance(magic)
    # notebook 03 ends with the same export of the run it built
    assert without_provenance(read_export(small_run / "magic" / "hf_dataset").magic) == without_provenance(magic)


def _drop_split_file(dest: Path) -> None:
    (dest / SPLIT_FILES["test"]).unlink()


def _drop_a_referenced_node(dest: Path) -> None:
    """Remove the first l2 node from the nodes table: image rows still name it as their l2 node."""
    table = pq.read_table(dest / NODES_FILE)
    rows = table.to_pylist()
    first_l2 = min(r["id"] for r in rows if r["level"] == 2)
    pq.write_table(table.from_pylist([r for r in rows if r["id"] != first_l2], schema=table.schema),
                   dest / NODES_FILE)


def _unknown_schema_version(dest: Path) -> None:
    card = dest / CARD_FILE
    card.write_text(card.read_text().replace("magic_schema_version: 2", "magic_schema_version: 99"))


def _unknown_format_version(dest: Path) -> None:
    card = dest / CARD_FILE
    card.write_text(card.read_text().replace("  format_version: 1\n", "  format_version: 7\n"))


def _edited_table1(dest: Path) -> None:
    card = dest / CARD_FILE
    card.write_text(card.read_text().replace("    l1 nodes: 52\n", "    l1 nodes: 51\n"))


@pytest.mark.parametrize("damage, file, problem", [
    (_drop_split_file, "data/test-00000-of-00001.parquet", "is missing: the export is incomplete"),
    (_drop_a_referenced_node, "data/train-00000-of-00001.parquet", f"which {NODES_FILE} does not define"),
    (_unknown_schema_version, CARD_FILE, "magic_schema_version 99 is unknown to this cglib"),
    (_unknown_format_version, CARD_FILE, "export format_version 7 is unknown to this cglib"),
    (_edited_table1, CARD_FILE, "Table 1 in the card differs from the tables"),
], ids=["missing split file", "undefined node", "unknown schema version", "unknown format", "edited Table 1"])
def test_a_corrupt_or_incomplete_export_is_refused_naming_file_and_problem(exported, tmp_path, damage, file,
                                                                           problem):
    """Each damage is refused by the reader that every import goes through, naming the damaged file."""
    dest = tmp_path / "magic"
    shutil.copytree(exported, dest)
    read_export(dest)  # intact copy reads
    damage(dest)
    with pytest.raises(ExportError) as err:
        read_export(dest)
    assert str(dest / file) in str(err.value) and problem in str(err.value)
    assert "cglib export-magic" in str(err.value) or "update cglib" in str(err.value)


def test_magic_source_is_validated_and_a_hub_id_fails_offline_with_the_fix(tmp_path):
    """magic.source accepts build, an existing folder (relative to the repo root) or owner/name; anything else is a
    params error. Offline (HF_HUB_OFFLINE=1, as in every test), a Hub id that is not cached says how to fix it."""
    (tmp_path / "exports" / "m").mkdir(parents=True)
    params = parse_params({"magic": {"source": "exports/m"}}, tmp_path)
    assert params.magic.source == str(tmp_path / "exports" / "m")
    assert parse_params({"magic": {"source": "someone/magic-coco"}}, tmp_path).magic.source == "someone/magic-coco"
    with pytest.raises(ParamsError, match="magic.source: .*not a folder and 'no/such/dir' is not a Hugging Face"):
        parse_params({"magic": {"source": "no/such/dir"}}, tmp_path)
    with pytest.raises(ParamsError, match="magic.sourze: unknown key; did you mean 'source'"):
        parse_params({"magic": {"sourze": "build"}}, tmp_path)
    with pytest.raises(ExportError, match="cannot download the Hugging Face dataset .*huggingface-cli download "
                                          "cglib-tests/no-such-magic --repo-type dataset"):
        resolve_source("cglib-tests/no-such-magic")


def test_real_image_export_references_files_and_counts_missing_ones(tmp_path):
    """A run on image files exports COCO ids and file names, no pixels; importing resolves them against the user's
    image folder, counts the missing ones by reason, keeps them in MAGIC (the dataset's definition) and reads back
    the same magic.json."""
    magic, pixels_dataset = tiny_magic()
    coco_ids = {old: str(100 + n) for n, old in enumerate(pixels_dataset.image_ids)}  # COCO ids are integers
    raw = magic.model_dump(mode="json")
    raw["images"] = {coco_ids[k]: {**v, "id": coco_ids[k]} for k, v in raw["images"].items()}
    magic = magic.model_validate(raw)
    images = tmp_path / "coco" / "train2017"
    images.mkdir(parents=True)
    files = {}
    for row, old in enumerate(pixels_dataset.image_ids):
        files[coco_ids[old]] = images / f"{int(coco_ids[old]):012d}.png"
        Image.fromarray(pixels_dataset.pixels[row]).save(files[coco_ids[old]])
    run = tmp_path / "run"
    save_magic(magic, run / "magic" / "magic.json")
    ids = sorted(files, key=int)
    CaptionDataset(source="coco", image_ids=ids, captions={i: magic.images[i].captions for i in ids},
                   image_files=files, meta={"image_dir": str(images)}).save(run / "captions")
    (run / "params.yaml").write_text("{}\n")

    dest = tmp_path / "export"
    export_magic(run, dest)
    rows = pq.read_table(dest / SPLIT_FILES["train"]).to_pylist()
    assert all(r["file_name"] == f"{int(r['image_id']):012d}.png" and r["coco_id"] == int(r["image_id"])
               and r["ground_truth"] is None for r in rows)
    assert not list(dest.rglob("*.png"))  # images are referenced, never copied

    files[ids[0]].unlink()
    files[ids[5]].unlink()
    params = Params.model_validate({"data": {"source": "coco", "coco_captions": str(tmp_path / "unused.json"),
                                             "coco_images": str(images)},
                                    "magic": {"source": str(dest)}})
    dataset, ground_truth = captions_from_export(params)
    assert ground_truth is None and sorted(dataset.image_ids, key=int) == ids
    assert dataset.meta["images_unreadable"] == {"image file missing": 2}
    assert dataset.meta["unreadable_ids"] == sorted([ids[0], ids[5]], key=dataset.image_ids.index)
    assert dataset.image_files[ids[1]] == files[ids[1]]
    assert without_provenance(read_export(dest).magic) == without_provenance(magic)

    with pytest.raises(ValueError, match="set data.source: coco and data.coco_images"):
        captions_from_export(Params.model_validate({"magic": {"source": str(dest)}}))


def _series_params(run_dir: Path, path: Path, **magic) -> Path:
    """The shared run's params, shrunk further for training (the tiny ViT, no base, one CLIP run) as a params file:
    what must agree is the data both runs train and evaluate on, not how good the model is."""
    params = yaml.safe_load((run_dir / "params.yaml").read_text())
    params["model"].update(name="cglib-tiny-vit", text_tower="minilm", freeze_text=True)
    params["train"]["runs"] = [{"name": "clip", "loss": "clip"}]
    params["train"]["seeds"] = [0]  # the demo's other training seeds add nothing to a comparison of two MAGIC files
    params["search"]["run"] = None  # the demo tunes 'pairwise', which this single-run round trip does not train
    params["train"]["base"]["corpus"] = "none"
    params["eval"]["bootstrap"] = 20
    params["magic"].update(magic)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.fixture(scope="module")
def imported(small_run, exported, tmp_path_factory) -> Path:
    """A fresh run whose notebooks 01-03 import the shared run's exported MAGIC (no LLM): its run folder."""
    root = tmp_path_factory.mktemp("imported")
    params = _series_params(small_run, root / "params" / "imported.yaml", source=str(exported))
    assert cli_main(["run", str(params), "--out", str(root / "run"), "--only", "01,02,03"]) == 0
    return root / "run"


@pytest.mark.slow
def test_an_imported_magic_is_the_built_one_with_the_same_images_and_ground_truth(small_run, exported, imported):
    """Export the shared run's MAGIC and import it into a fresh run (notebooks 01-03 in import mode, no LLM): the
    same magic.json up to provenance, the same re-rendered images and ground truth, and a card that still credits
    the original build."""
    original, again = load_magic(small_run / "magic" / "magic.json"), load_magic(imported / "magic" / "magic.json")
    assert without_provenance(again) == without_provenance(original)
    assert again.provenance["imported_from"] == str(exported)
    assert again.provenance["export_provenance"] == original.provenance
    assert not (imported / "abstraction" / "chains.jsonl").exists()  # no LLM, no abstraction
    # notebook 03 of the imported run exports it again: the card still credits the original build
    again_card = read_export(imported / "magic" / "hf_dataset")
    assert again_card.info["built_by"] == read_export(exported).info["built_by"]
    assert without_provenance(again_card.magic) == without_provenance(original)

    first, second = CaptionDataset.load(small_run / "captions"), CaptionDataset.load(imported / "captions")
    rows = [first.image_ids.index(i) for i in second.image_ids]
    assert set(second.image_ids) == set(original.images)
    assert np.array_equal(first.pixels[rows], second.pixels)
    truth = load_ground_truth(small_run / "captions")
    assert load_ground_truth(imported / "captions") == {i: truth[i] for i in second.image_ids}
    executed = json.loads((imported / "notebooks" / "02_abstraction.ipynb").read_text())
    text = "".join("".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", []))
    assert "MAGIC imported from" in text and "Table 1 in the card equals" in text


@pytest.mark.slow
@pytest.mark.full  # `make test-full` only (book/tests.md)
def test_the_imported_magic_trains_and_scores_as_the_built_one(small_run, imported, tmp_path):
    """Both runs of the round trip above trained and evaluated (notebooks 05-06): the same Table 3."""
    built = tmp_path / "built"
    shutil.copytree(small_run, built)
    built_params = _series_params(small_run, tmp_path / "params" / "built.yaml")
    assert cli_main(["run", str(built_params), "--out", str(built), "--only", "05,06"]) == 0
    imported_params = imported.parent / "params" / "imported.yaml"  # the fixture's params file
    assert cli_main(["run", str(imported_params), "--out", str(imported), "--only", "05,06"]) == 0

    table_built = pd.read_csv(built / "evaluation" / "table3.csv")
    table_imported = pd.read_csv(imported / "evaluation" / "table3.csv")
    assert len(table_built) >= 2  # zero-shot and clip
    pd.testing.assert_frame_equal(table_built, table_imported)
