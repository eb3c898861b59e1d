"""The course in notebooks 00-02: each check passes the notebook's own solution on the practice and grading seeds
and fails plausible wrong answers with a message that names the mistake. (The student and solution versions of the
notebooks are executed by tests/test_course.py's slow tests.)"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import nbformat
import numpy as np
import pytest

from cglib.config import load_params
from cglib.course import GRADING_SEEDS, PRACTICE_SEEDS, CheckFailed
from cglib.course.abstraction_checks import (
    check_chain_agreement,
    check_concept_reply,
    check_full_run_cost,
    library_verdict,
    reply_cases,
)
from cglib.course.caption_checks import check_caption_statistics, check_parse_coco
from cglib.course.epoch_checks import check_pairs_epoch, check_published_epoch, epoch_case
from cglib.llm.canonical import canonicalize
from cglib.llm.cost import CONCEPT_REPLY_TOKENS
from cglib.llm.replies import ReplyError

REPO = Path(__file__).resolve().parent.parent
DEMO = load_params(REPO / "params" / "demo.yaml")


def solution_function(notebook: str, name: str):
    """The function `name` as the notebook's solution cell defines it: the cell up to its check call (what follows
    the check uses the run's data)."""
    nb = nbformat.read(REPO / "notebooks" / notebook, as_version=4)
    source = next(c.source for c in nb.cells if c.cell_type == "code" and f"def {name}(" in c.source)
    before_check = re.split(r"^check_", source, maxsplit=1, flags=re.MULTILINE)[0]
    namespace: dict = {}
    exec(compile(before_check, f"{notebook}:{name}", "exec"), namespace)  # noqa: S102 (the repository's own notebook)
    return namespace[name]


def fails_with(check, answer, *words, **kwargs):
    with pytest.raises(CheckFailed) as failure:
        check(answer, **kwargs)
    for word in words:
        assert word in str(failure.value), f"{word!r} not in the message:\n{failure.value}"
    return str(failure.value)


SOLUTIONS = (("00_overview.ipynb", "my_pairs_epoch", check_pairs_epoch, {}),
             ("00_overview.ipynb", "my_published_epoch_steps", check_published_epoch, {}),
             ("01_captions.ipynb", "my_parse_coco", check_parse_coco, {}),
             ("01_captions.ipynb", "my_caption_statistics", check_caption_statistics, {}),
             ("02_abstraction.ipynb", "my_check_reply", check_concept_reply, {}),
             ("02_abstraction.ipynb", "my_chain_agreement", check_chain_agreement, {}),
             ("02_abstraction.ipynb", "my_chain_cost", check_full_run_cost, {"params": DEMO}))


@pytest.mark.parametrize(("notebook", "name", "check", "kwargs"), SOLUTIONS, ids=[s[1] for s in SOLUTIONS])
def test_the_notebook_solution_passes_on_the_practice_and_the_grading_seeds(notebook, name, check, kwargs, capsys):
    assert set(PRACTICE_SEEDS).isdisjoint(GRADING_SEEDS)
    fn = solution_function(notebook, name)
    check(fn, **kwargs)
    check(fn, seeds=GRADING_SEEDS, **kwargs)
    out = capsys.readouterr().out
    assert out.count("Correct:") == 2 and "seeds 1001, 1002" in out


# --- notebook 00: epochs ------------------------------------------------------------------------------------------

def test_pairs_epoch_check_names_the_dropped_chunk_the_mixed_groups_and_the_repeats():
    right = solution_function("00_overview.ipynb", "my_pairs_epoch")
    fails_with(check_pairs_epoch, lambda sizes, n: {"steps": sum(s // n for s in sizes.values()), "repeats": 0},
               "floor division", "the authors' epoch drops it")
    fails_with(check_pairs_epoch, lambda sizes, n: {"steps": -(-sum(sizes.values()) // n), "repeats": 0},
               "a chunk never mixes groups")
    fails_with(check_pairs_epoch, lambda sizes, n: {**right(sizes, n), "repeats": 0}, "the steps are right",
               "what its last chunk lacks")
    fails_with(check_pairs_epoch, lambda sizes, n: {"steps": sum(s / n for s in sizes.values()), "repeats": 0},
               "whole number")
    fails_with(check_pairs_epoch, lambda sizes, n: right(sizes, n)["steps"], "return a dict")


def test_published_epoch_check_names_the_forgotten_rule():
    # the practice cases tell every slip apart: all concepts, one pass, and the two-pass rule give three counts
    for seed in PRACTICE_SEEDS:
        sizes, hard, n, m = epoch_case(seed)
        complete = {g: s // n for g, s in sizes.items()}
        one_pass = sum(c for g, c in complete.items() if c and len(hard[g]) >= m - 1)
        assert len({sum(complete.values()), one_pass, solution_function(
            "00_overview.ipynb", "my_published_epoch_steps")(sizes, hard, n, m)}) == 3
    fails_with(check_published_epoch, lambda sizes, hard, n, m: sum(s // n for s in sizes.values()),
               "you kept every concept")
    fails_with(check_published_epoch,
               lambda sizes, hard, n, m: sum(s // n for g, s in sizes.items() if s // n and len(hard[g]) >= m - 1),
               "second pass")
    fails_with(check_published_epoch, lambda sizes, hard, n, m: sum(-(-s // n) for s in sizes.values()),
               "incomplete last chunk is DROPPED")


# --- notebook 01: COCO captions and statistics --------------------------------------------------------------------

def parse_variant(path, *, normalize=True, count_without=True, key=int, dedupe=True):
    record = json.loads(Path(path).read_text())
    listed = {image["id"] for image in record["images"]}
    captions, skipped = {}, Counter()
    for annotation in record["annotations"]:
        text = " ".join(annotation["caption"].split()) if normalize else annotation["caption"].strip()
        image = key(annotation["image_id"])
        if annotation["image_id"] not in listed:
            skipped["caption for unknown image id"] += 1
        elif not text:
            skipped["empty caption"] += 1
        elif dedupe and text in captions.get(image, []):
            skipped["duplicate caption"] += 1
        else:
            captions.setdefault(image, []).append(text)
    if count_without:
        skipped["image without captions"] = len(listed) - len(captions)
    return captions, dict(skipped)


def test_parse_coco_check_names_whitespace_duplicates_and_uncounted_images():
    check_parse_coco(parse_variant)
    fails_with(check_parse_coco, lambda path: parse_variant(path, normalize=False), "runs of spaces, tabs",
               "'duplicate caption'")
    fails_with(check_parse_coco, lambda path: parse_variant(path, dedupe=False), "'duplicate caption'")
    fails_with(check_parse_coco, lambda path: parse_variant(path, count_without=False),
               "missing reason 'image without captions'")
    fails_with(check_parse_coco, lambda path: parse_variant(path, key=str), "integer COCO id")
    fails_with(check_parse_coco, lambda path: parse_variant(path)[0], "return a pair")


def statistics_variant(captions, *, lower=True, strip=True, per_image=False):
    lengths = [len(c.split()) for cs in captions.values() for c in cs]
    if per_image:
        lengths = [np.mean([len(c.split()) for c in cs]) for cs in captions.values()]
    words = {w for cs in captions.values() for c in cs for w in c.split()}
    words = {w.strip(".,;:!?\"'()") if strip else w for w in words}
    words = {w.lower() if lower else w for w in words}
    return {"mean_words": np.mean(lengths), "median_words": np.median(lengths), "vocabulary": len(words - {""})}


def test_caption_statistics_check_names_case_punctuation_and_the_mean_over_images():
    check_caption_statistics(statistics_variant)
    fails_with(check_caption_statistics, lambda c: statistics_variant(c, lower=False, strip=False),
               "vocabulary differs", "counted the words as written")
    fails_with(check_caption_statistics, lambda c: statistics_variant(c, strip=False), "also strip the punctuation")
    fails_with(check_caption_statistics, lambda c: statistics_variant(c, lower=False), "also lower-case")
    fails_with(check_caption_statistics, lambda c: statistics_variant(c, per_image=True), "mean_words differs",
               "over the images' average lengths")


# --- notebook 02: replies, agreement, cost ------------------------------------------------------------------------

def reply_variant(content, finish_reason, chain, max_chars, *, fence=True, length_first=True, canonical_repeat=True,
                  forbid_extra=True, catch_json=True):
    if finish_reason == "length":
        raise ReplyError("truncated")
    if finish_reason == "content_filter":
        raise ReplyError("refusal")
    if content is None or not content.strip():
        raise ReplyError("empty")
    if length_first and len(content) > max_chars:
        raise ReplyError("too_long")
    fenced = re.fullmatch(r"\s*```(?:json)?\s*(.*?)\s*```\s*", content, re.DOTALL) if fence else None
    text = fenced.group(1) if fenced else content
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        if not catch_json:
            raise
        raise ReplyError("invalid_json") from None
    if len(content) > max_chars:
        raise ReplyError("too_long")
    if not isinstance(data, dict) or "concept" not in data or not isinstance(data["concept"], str) \
            or (forbid_extra and set(data) != {"concept"}):
        raise ReplyError("missing_fields")
    if not canonical_repeat and data["concept"] in chain:
        raise ReplyError("repeated_concept")
    concept = canonicalize(data["concept"])
    if not concept:
        raise ReplyError("empty")
    if len(concept) > 60 or len(concept.split()) > 6:
        raise ReplyError("invalid_concept")
    if canonical_repeat and concept in chain:
        raise ReplyError("repeated_concept")
    return concept


def test_the_seeded_replies_meet_every_reason():
    reasons = {library_verdict(c, f, chain, m).removeprefix("rejected: ") for seed in PRACTICE_SEEDS
               for cases, m in [reply_cases(seed)] for c, f, chain in cases}
    assert {"truncated", "refusal", "empty", "too_long", "invalid_json", "missing_fields", "invalid_concept",
            "repeated_concept"} <= reasons


def test_reply_check_names_the_fence_the_order_the_canonical_repeat_and_extra_keys():
    check_concept_reply(reply_variant)
    slip = lambda **kw: lambda *a: reply_variant(*a, **kw)
    fails_with(check_concept_reply, slip(fence=False), "code fence", "the library's: concept:")
    fails_with(check_concept_reply, slip(length_first=False), "yours: rejected: invalid_json",
               "the library's: rejected: too_long", "before it is parsed")
    fails_with(check_concept_reply, slip(canonical_repeat=False), "rejected: repeated_concept",
               "canonicalize the concept first")
    fails_with(check_concept_reply, slip(forbid_extra=False), "rejected: missing_fields", "extra keys")
    fails_with(check_concept_reply, slip(catch_json=False, length_first=True), "your function raised",
               "raise ReplyError")


def agreement_variant(chains, truth, l_max, *, canonical=True, scored_by="truth"):
    scored = [i for i in truth if i in chains]
    rows = []
    same = (lambda a, b: canonicalize(a) == canonicalize(b)) if canonical else (lambda a, b: a == b)
    for level in range(1, l_max + 1):
        right = sum(1 for i in scored if len(chains[i]) >= level and same(chains[i][level - 1], truth[i][level - 1]))
        denominator = len(scored) if scored_by == "truth" else len(chains)
        rows.append({"accuracy": right / denominator, "accuracy_all": right / len(truth),
                     "coverage": len(scored) / len(truth)})
    return rows


def test_agreement_check_names_canonical_names_and_the_denominators():
    check_chain_agreement(agreement_variant)
    fails_with(check_chain_agreement, lambda *a: agreement_variant(*a, canonical=False), "compare canonical names")
    fails_with(check_chain_agreement, lambda *a: agreement_variant(*a, scored_by="chains"), "level 1, accuracy",
               "divided by all", "no ground truth")
    fails_with(check_chain_agreement,
               lambda *a: [{**row, "coverage": 1.0} for row in agreement_variant(*a)], "coverage",
               "share of ground-truth images that have a chain")
    fails_with(check_chain_agreement, lambda *a: agreement_variant(*a)[:1], "one per level")


def cost_variant(tokens, images, llm, *, outputs="per level", batch=True, first_level_only=False):
    input_tokens = images * (tokens[0] * len(tokens) if first_level_only else sum(tokens))
    replies = {"per level": images * len(tokens), "per image": images, "none": 0}[outputs]
    live = (input_tokens * llm.price_input_per_1m + replies * CONCEPT_REPLY_TOKENS * llm.price_output_per_1m) / 1e6
    return {"live": live, "batch": live * (llm.batch_price_factor if batch else 1.0)}


def test_cost_check_names_the_output_tokens_the_batch_factor_and_the_levels():
    check_full_run_cost(cost_variant, DEMO)
    fails_with(check_full_run_cost, lambda *a: cost_variant(*a, outputs="none"), "live cost", "input tokens alone",
               params=DEMO)
    fails_with(check_full_run_cost, lambda *a: cost_variant(*a, outputs="per image"), "one reply per image",
               params=DEMO)
    fails_with(check_full_run_cost, lambda *a: cost_variant(*a, batch=False), "batch cost",
               "multiplies it by llm.batch_price_factor", params=DEMO)
    fails_with(check_full_run_cost, lambda *a: cost_variant(*a, first_level_only=True), "level 1's tokens",
               params=DEMO)


def test_a_wrong_answer_fails_on_the_grading_seeds_too():
    with pytest.raises(CheckFailed, match="a chunk never mixes groups"):
        check_pairs_epoch(lambda sizes, n: {"steps": -(-sum(sizes.values()) // n), "repeats": 0},
                          seeds=GRADING_SEEDS)
    with pytest.raises(CheckFailed, match="canonicalize the concept first"):
        check_concept_reply(lambda *a: reply_variant(*a, canonical_repeat=False), seeds=GRADING_SEEDS)


def test_the_student_stub_error_is_not_turned_into_a_check_failure():
    def stub(*args):
        raise NotImplementedError("Exercise: write your solution here")

    for check, kwargs in ((check_concept_reply, {}), (check_chain_agreement, {}), (check_full_run_cost,
                          {"params": DEMO}), (check_pairs_epoch, {}), (check_published_epoch, {}),
                          (check_parse_coco, {}), (check_caption_statistics, {})):
        with pytest.raises(NotImplementedError):
            check(stub, **kwargs)
