"""Checks of notebook 01's exercises: reading a COCO captions file with the library's rules (against
`cglib.data.coco.parse_coco_captions`) and the caption statistics of section 2 (against
`cglib.viz.data_figures.caption_statistics`)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from cglib.course.feedback import PRACTICE_SEEDS, CheckFailed, close, difference, passed
from cglib.data.coco import parse_coco_captions
from cglib.data.dataset import CaptionDataset
from cglib.viz.data_figures import caption_statistics

WORDS = ("dog", "cat", "red", "ball", "table", "two", "a", "on", "the", "of", "kitchen", "man", "Frisbee", "park")


def coco_case(seed: int) -> dict:
    """A seeded COCO captions file (as a dict) with every per-item problem the loader counts: a caption of an
    unknown image, empty and whitespace-only captions, a caption repeated with other spacing, an image without
    captions, and captions with runs of spaces, tabs and newlines."""
    rng = np.random.default_rng(seed)
    ids = [int(i) for i in rng.choice(np.arange(1, 10_000), size=int(rng.integers(5, 9)), replace=False)]
    images = [{"id": i, "file_name": f"COCO_{i:012d}.jpg", "height": 480, "width": 640} for i in ids]
    annotations = []

    def add(image_id: int, caption: str) -> None:
        annotations.append({"id": len(annotations) + 1, "image_id": image_id, "caption": caption})

    for image_id in ids[1:]:  # the first image gets no caption at all
        for _ in range(int(rng.integers(1, 4))):
            words = [str(w) for w in rng.choice(WORDS, size=int(rng.integers(3, 7)))]
            add(image_id, " ".join(words).capitalize() + ".")
    first = ids[1]
    spaced = "  A dog \t on  the\ntable. "
    add(first, spaced)
    add(first, "A dog on the table.")  # the same caption once the whitespace is normalized
    add(ids[2], "   ")
    add(ids[2], "")
    add(max(ids) + int(rng.integers(1, 50)), "A caption of an image that is not listed.")
    order = rng.permutation(len(annotations))
    return {"info": {"description": f"seeded course case {seed}"}, "images": images,
            "annotations": [annotations[k] for k in order]}


def write_coco_case(seed: int, folder: str | Path) -> Path:
    """The seeded case as a file `captions_course_<seed>.json` in `folder`."""
    path = Path(folder) / f"captions_course_{seed}.json"
    path.write_text(json.dumps(coco_case(seed), indent=1), encoding="utf-8")
    return path


def _parse_hints(yours: dict, expected: dict, skipped: dict, expected_skipped: dict) -> list[str]:
    hints = []
    raw = [c for cs in yours.values() for c in cs]
    if any(c != " ".join(c.split()) for c in raw):
        hints.append("some of your captions keep runs of spaces, tabs or newlines: normalize each caption by "
                     "collapsing every run of whitespace to one space and stripping the ends (' '.join(c.split()))")
    if any(not c for c in raw):
        hints.append("an empty (or whitespace-only) caption is skipped and counted as 'empty caption'")
    if "duplicate caption" not in skipped and "duplicate caption" in expected_skipped:
        hints.append("a caption that repeats another caption of the same image after normalization is skipped and "
                     "counted as 'duplicate caption'")
    if set(yours) - set(expected):
        hints.append(f"images {sorted(set(yours) - set(expected))} are in your answer but not the library's: an "
                     "image with no usable caption is left out (and counted as 'image without captions'); a caption "
                     "of an id missing from 'images' is counted as 'caption for unknown image id'")
    if any(not isinstance(k, int) for k in yours):
        hints.append("key the captions by the integer COCO id (annotation['image_id']), as the file does")
    return hints


def check_parse_coco(fn: Callable, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(path)` -> (captions, skipped): {integer image id: [normalized captions in file order]} for the images
    that keep a caption, and {reason: count} of every skipped item, as `parse_coco_captions` gives them."""
    for seed in seeds:
        with tempfile.TemporaryDirectory() as folder:
            path = write_coco_case(seed, folder)
            answer = fn(path)
            reference = parse_coco_captions(path)
        if not (isinstance(answer, tuple) and len(answer) == 2 and all(isinstance(a, dict) for a in answer)):
            raise CheckFailed("return a pair (captions, skipped) of two dicts: {image id: [captions]} and "
                              f"{{reason: count}}; got {type(answer).__name__}")
        captions, skipped = answer
        skipped = {reason: count for reason, count in skipped.items() if count}
        expected_skipped = dict(reference.skipped)
        if captions != reference.captions:
            differing = sorted((set(captions) ^ set(reference.captions))
                               | {i for i in set(captions) & set(reference.captions)
                                  if captions[i] != reference.captions[i]}, key=str)
            lines = [f"captions differ on the seeded file {seed} for the images {differing}"]
            shown = differing[0]
            lines.append(f"  image {shown!r}: yours {captions.get(shown)}, the library's "
                         f"{reference.captions.get(shown)}")
            hints = _parse_hints(captions, reference.captions, skipped, expected_skipped)
            if not hints and any(set(captions.get(i, [])) == set(reference.captions.get(i, [])) for i in differing):
                hints.append("the same captions in another order: keep each image's captions in file order")
            lines += [f"  hint: {h}" for h in hints]
            raise CheckFailed("\n".join(lines))
        if skipped != expected_skipped:
            lines = [(f"the skip counts differ on the seeded file {seed}: yours {skipped}, the library's "
                     f"{expected_skipped}")]
            lines += [f"  hint: {h}" for h in _parse_hints(captions, reference.captions, skipped, expected_skipped)]
            for reason in expected_skipped:
                if reason not in skipped:
                    lines.append(f"  missing reason {reason!r} (use the library's words: they are the keys of the "
                                 "dataset's `skipped`)")
            raise CheckFailed("\n".join(lines))
    passed("your COCO captions reader (captions and skip counts)", seeds)


STATISTICS = ("mean_words", "median_words", "vocabulary")


def captions_case(seed: int) -> dict[str, list[str]]:
    """Seeded captions with mixed case, punctuation and quotes (so the vocabulary's rules show), an uneven number
    per image (so a mean over images differs from one over captions)."""
    rng = np.random.default_rng(seed)
    words = ["A", "a", "dog", "Dog", "dog,", "cat.", "\"red\"", "ball!", "(table)", "two", "kitchen;", "man's",
             "Frisbee", "park?", "on", "the", "The"]
    captions = {}
    for k in range(int(rng.integers(4, 9))):
        captions[f"image {k}"] = [" ".join(str(w) for w in rng.choice(words, size=int(rng.integers(2, 12))))
                                  for _ in range(int(rng.integers(1, 6)))]
    return captions


def library_statistics(captions: dict[str, list[str]]) -> dict[str, float]:
    ids = list(captions)
    dataset = CaptionDataset(source="course", image_ids=ids, captions=captions,
                             pixels=np.zeros((len(ids), 1, 1, 3), dtype=np.uint8))
    stats = caption_statistics(dataset)
    return {"mean_words": stats["caption_words"]["mean"], "median_words": stats["caption_words"]["median"],
            "vocabulary": stats["vocabulary"]}


def check_caption_statistics(fn: Callable, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(captions)` -> {"mean_words", "median_words", "vocabulary"} must match `caption_statistics`: words are
    what str.split() gives, the mean and median over every caption, the vocabulary the distinct words once
    lower-cased and stripped of the punctuation around them."""
    for seed in seeds:
        captions = captions_case(seed)
        answer = fn({i: list(c) for i, c in captions.items()})
        if not isinstance(answer, dict) or set(STATISTICS) - set(answer):
            raise CheckFailed(f"return a dict with the keys {', '.join(STATISTICS)}; got "
                              f"{sorted(answer) if isinstance(answer, dict) else type(answer).__name__}")
        expected = library_statistics(captions)
        for key in STATISTICS:
            yours = float(answer[key])
            if close(yours, expected[key]):
                continue
            lines = [f"{key} differs on the seeded captions {seed}: {difference(yours, expected[key])}"]
            every = [w for cs in captions.values() for c in cs for w in c.split()]
            if key == "vocabulary":
                if yours == len(set(every)):
                    lines.append("  hint: you counted the words as written: 'Dog', 'dog' and 'dog,' are one word "
                                 "once lower-cased and stripped of punctuation around it (.,;:!?\"'())")
                elif yours == len({w.lower() for w in every}):
                    lines.append("  hint: lower-casing is right; also strip the punctuation around each word "
                                 "(.,;:!?\"'()), so 'dog,' and 'dog' are one word")
                elif yours == len({w.strip(".,;:!?\"'()") for w in every}):
                    lines.append("  hint: stripping is right; also lower-case, so 'The' and 'the' are one word")
            else:
                per_image = [np.mean([len(c.split()) for c in cs]) for cs in captions.values()]
                if close(yours, float(np.mean(per_image) if key == "mean_words" else np.median(per_image))):
                    lines.append("  hint: that is over the images' average lengths; take every caption as one "
                                 "value, so an image with more captions weighs more")
                else:
                    lines.append("  hint: a caption's length is the number of words str.split() gives (not "
                                 "characters)")
            raise CheckFailed("\n".join(lines))
    passed("your caption statistics (mean and median words, vocabulary)", seeds)
