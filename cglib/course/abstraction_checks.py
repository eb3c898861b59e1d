"""Checks of notebook 02's exercises: validating an LLM's concept reply (against `cglib.llm.replies.check_message`),
the cost of the paper's full run of chains (against `cglib.llm.cost.estimate_full_coco`) and the agreement of
chains with the ground truth (against `cglib.llm.chains.chain_agreement`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

import numpy as np

from cglib.config import Params
from cglib.course.feedback import PRACTICE_SEEDS, CheckFailed, close, difference, passed
from cglib.llm.base import ConceptTask
from cglib.llm.canonical import canonicalize
from cglib.llm.chains import chain_agreement
from cglib.llm.cost import (
    COCO_CAPTION_CHARS,
    CONCEPT_REPLY_TOKENS,
    estimate_concept_requests,
    estimate_full_coco,
    stand_in_text,
)
from cglib.llm.replies import Message, ReplyError, check_message

CHAINS = (["birthday party", "celebration", "social gathering"], ["tennis match", "sport event", "competition"],
          ["breakfast", "meal", "daily routine"], ["beach holiday", "vacation", "leisure"])


def reply_cases(seed: int) -> tuple[list[tuple[str | None, str, tuple[str, ...]]], int]:
    """Seeded replies (content, finish_reason, chain so far) covering every rule of a concept reply, shuffled, and
    the llm.max_reply_chars they are judged with."""
    rng = np.random.default_rng(seed)
    chain = tuple(CHAINS[int(rng.integers(len(CHAINS)))][:int(rng.integers(1, 3))])
    fresh = str(rng.choice(["Winter Sports", "The Picnics", "a Wedding-Reception", "Kitchens & Cooking",
                            "Children's Parties"]))
    repeat = {"celebration": "Celebrations", "sport event": "Sport-Events", "meal": "The Meals",
              "vacation": "Vacations!", "birthday party": "Birthday Parties", "tennis match": "tennis matches",
              "breakfast": "BREAKFASTS", "beach holiday": "beach-holidays"}[chain[-1]]
    max_chars = int(rng.choice([120, 160, 200]))
    cases = [
        (json.dumps({"concept": fresh}), "stop"),
        (f"```json\n{json.dumps({'concept': fresh})}\n```", "stop"),  # fenced: accepted
        (json.dumps({"concept": repeat}), "stop"),  # the previous level once canonical
        (json.dumps({"concept": "a very long phrase that is not a concept at all"}), "stop"),
        (json.dumps({"concept": "?!"}), "stop"),  # empty once canonical
        (json.dumps({"concept": ""}), "stop"),
        (json.dumps({"name": fresh}), "stop"),
        (json.dumps({"concept": fresh, "reason": "the captions mention it"}), "stop"),  # extra key
        (json.dumps({"concept": 42}), "stop"),
        (json.dumps([fresh]), "stop"),
        (f"The concept is {fresh}.", "stop"),
        (json.dumps({"concept": fresh})[:-2], "length"),  # cut off
        (json.dumps({"concept": fresh}), "content_filter"),
        ("   ", "stop"),
        (None, "stop"),
        (json.dumps({"concept": fresh, "notes": "x" * max_chars}), "stop"),  # too long, and an extra key too
        ("{" + "\"concept\": " * (max_chars // 10), "stop"),  # too long and not JSON: the length rule comes first
    ]
    order = rng.permutation(len(cases))
    return [(cases[k][0], cases[k][1], chain) for k in order], max_chars


def library_verdict(content: str | None, finish_reason: str, chain: tuple[str, ...], max_chars: int) -> str:
    """'concept: <canonical concept>' or 'rejected: <reason>', as the engine judges the reply."""
    task = ConceptTask("course", len(chain) + 1, (), chain)
    try:
        return "concept: " + check_message(Message(content, None, finish_reason), task, max_chars)
    except ReplyError as error:
        return "rejected: " + error.reason


def _student_verdict(fn: Callable, content, finish_reason, chain, max_chars) -> str:
    try:
        value = fn(content, finish_reason, list(chain), max_chars)
    except ReplyError as error:
        return "rejected: " + error.reason
    except NotImplementedError:  # the student version's stub: the exercise is not done yet
        raise
    except Exception as error:  # noqa: BLE001 (any other exception is the student's slip, reported as such)
        raise CheckFailed(f"your function raised {type(error).__name__}: {error} on the reply {content!r} "
                          f"(finish_reason {finish_reason!r}); catch it and raise ReplyError(reason, detail) with the "
                          "library's reason instead") from None
    if not isinstance(value, str):
        raise CheckFailed(f"on the reply {content!r} your function returned {value!r}; return the canonical concept "
                          "(a str) or raise ReplyError(reason, detail)")
    return "concept: " + value


def _reply_hint(content, finish_reason, yours: str, expected: str, chain, max_chars) -> str:
    if expected == "rejected: too_long":
        return (f"a reply longer than llm.max_reply_chars ({max_chars}) is rejected as too_long before it is parsed, "
                "whatever else is wrong with it")
    if expected == "rejected: repeated_concept":
        return (f"canonicalize the concept first, then compare it with the chain so far {list(chain)}: "
                f"{canonicalize(json.loads(content)['concept'])!r} repeats an earlier level")
    if expected in ("rejected: truncated", "rejected: refusal"):
        return ("look at finish_reason before the content: 'length' means the reply was cut off (truncated), "
                "'content_filter' a refusal")
    if expected == "rejected: missing_fields":
        return ("the reply must be a JSON object with exactly one key, 'concept', holding a string (extra keys and "
                "other types are missing_fields, as the strict pydantic model ConceptReply says)")
    if expected == "rejected: empty":
        return ("no content, only whitespace, or a concept that is empty once canonicalized ('?!' has no word left) "
                "is 'empty'")
    if expected == "rejected: invalid_concept":
        return "a concept of more than 6 words or 60 characters (canonical form) is invalid_concept"
    if expected == "rejected: invalid_json":
        return "content that json.loads cannot read is invalid_json"
    if expected.startswith("concept:") and content and content.lstrip().startswith("```"):
        return "strip a ```json ... ``` code fence before parsing: servers without structured output add one"
    if expected.startswith("concept:") and yours.startswith("concept:"):
        return "return the canonical form of the concept (cglib.llm.canonical.canonicalize)"
    return "see the rules in the exercise, in the order given"


def check_concept_reply(fn: Callable, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(content, finish_reason, chain, max_reply_chars)` -> the canonical concept, or raises
    `ReplyError(reason, detail)` with the reason `check_message` gives, on seeded replies covering every rule."""
    for seed in seeds:
        cases, max_chars = reply_cases(seed)
        for content, finish_reason, chain in cases:
            expected = library_verdict(content, finish_reason, chain, max_chars)
            yours = _student_verdict(fn, content, finish_reason, chain, max_chars)
            if yours != expected:
                raise CheckFailed(
                    f"reply {content!r} (finish_reason {finish_reason!r}, chain so far {list(chain)}, "
                    f"max_reply_chars {max_chars}):\n  yours: {yours}\n  the library's: {expected}\n"
                    f"  hint: {_reply_hint(content, finish_reason, yours, expected, chain, max_chars)}")
    passed("your reply validation", seeds)


def cost_case(params: Params, seed: int) -> tuple[Params, int]:
    """`params` with seeded prices, Batch API factor and l_max, and a seeded number of images."""
    rng = np.random.default_rng(seed)
    price_in, price_out = [(0.15, 0.6), (2.5, 10.0), (0.05, 0.4), (1.1, 4.4)][int(rng.integers(4))]
    llm = params.llm.model_copy(update={"price_input_per_1m": price_in, "price_output_per_1m": price_out,
                                        "batch_price_factor": float(rng.choice([0.5, 0.4, 0.25]))})
    magic = params.magic.model_copy(update={"l_max": int(rng.integers(2, 6))})
    images = int(rng.choice([118_287, 50_000, 1_000, 330_000]))
    return params.model_copy(update={"llm": llm, "magic": magic}), images


def tokens_per_level(params: Params, captions_per_image: int = 5) -> list[float]:
    """Estimated input tokens of one chain request per level, for an image with COCO-length captions (what
    `estimate_full_coco` scales to the whole dataset)."""
    captions = [stand_in_text(COCO_CAPTION_CHARS)] * captions_per_image
    return estimate_concept_requests(params, [captions])["input_tokens_per_level"]


def library_chain_cost(params: Params, images: int) -> dict[str, float]:
    rows = estimate_full_coco(params, images=images)
    return {"live": rows[0]["cost_usd"], "batch": rows[2]["cost_usd"]}


def check_full_run_cost(fn: Callable, params: Params, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(tokens_per_level, images, llm)` -> {"live", "batch"}: USD of asking every level of every image's chain,
    as `estimate_full_coco`'s chain rows say, for seeded prices, Batch API factors, l_max and image counts."""
    for seed in seeds:
        p, images = cost_case(params, seed)
        tokens = tokens_per_level(p)
        answer = fn(list(tokens), images, p.llm)
        if not isinstance(answer, dict) or {"live", "batch"} - set(answer):
            raise CheckFailed("return a dict with the keys 'live' and 'batch' (USD); got "
                              f"{sorted(answer) if isinstance(answer, dict) else type(answer).__name__}")
        expected = library_chain_cost(p, images)
        llm = p.llm
        case = (f"{images:,} images, l_max {p.magic.l_max}, tokens per level {tokens}, prices {llm.price_input_per_1m}"
                f"/{llm.price_output_per_1m} USD per 1M input/output tokens, Batch API factor {llm.batch_price_factor}")
        for mode in ("live", "batch"):
            yours = float(answer[mode])
            if abs(yours - expected[mode]) <= 0.006:  # the library's rows are rounded to the cent
                continue
            factor = llm.batch_price_factor if mode == "batch" else 1.0
            tin, tout = images * sum(tokens), images * len(tokens) * CONCEPT_REPLY_TOKENS

            def usd(i, o, f=factor, llm=llm):
                return f * (i * llm.price_input_per_1m + o * llm.price_output_per_1m) / 1e6

            hints = {"input tokens alone: each of the images x l_max replies is also paid as "
                     f"{CONCEPT_REPLY_TOKENS} output tokens at the output price": usd(tin, 0),
                     "one reply per image: there is one reply per level": usd(tin, images * CONCEPT_REPLY_TOKENS),
                     "the live price: the Batch API multiplies it by llm.batch_price_factor": usd(tin, tout, 1.0),
                     "level 1's tokens for every level: later levels' requests are longer (they carry the chain)":
                         usd(images * tokens[0] * len(tokens), tout),
                     "prices are USD per million tokens: divide by 1e6": usd(tin, tout) * 1e6}
            found = [words for words, value in hints.items() if mode == "batch" or "Batch API" not in words
                     if close(yours, value, rtol=1e-3)]
            raise CheckFailed(f"{mode} cost for {case}: {difference(yours, expected[mode])}\n  hint: "
                              + (f"it matches {found[0]}" if found else
                                 "input tokens = images x the sum of tokens_per_level; output tokens = images x "
                                 f"l_max x {CONCEPT_REPLY_TOKENS}; USD = factor x (input x input price + output x "
                                 "output price) / 1e6"))
    passed("your cost of the paper's chains", seeds)


def agreement_case(seed: int) -> tuple[dict[str, list[str]], dict[str, list[str]], int]:
    """Seeded predicted chains and ground truth: some images without a chain, some predictions for images the
    truth does not hold, some names in a non-canonical form, some shorter chains, some wrong levels."""
    rng = np.random.default_rng(seed)
    l_max = int(rng.integers(3, 5))
    truth_chains = [list(c) + ["human activity"] for c in CHAINS]
    truth, chains = {}, {}
    for k in range(int(rng.integers(12, 24))):
        image = f"image {k}"
        true = truth_chains[int(rng.integers(len(truth_chains)))][:l_max]
        truth[image] = true
        roll = rng.random()
        if roll < 0.15:
            continue  # no chain (a failure)
        chain = list(true)
        for level in range(l_max):
            if rng.random() < 0.25:  # a wrong concept at this level
                chain[level] = truth_chains[int(rng.integers(len(truth_chains)))][level]
        if roll > 0.7:
            chain = [name.upper() if name.endswith(("party", "match")) else name.title() + "s"
                     for name in chain]  # the same names, not canonical
        if rng.random() < 0.1:
            chain = chain[:l_max - 1]
        chains[image] = chain
    for k in range(int(rng.integers(1, 4))):
        chains[f"unlisted {k}"] = list(truth_chains[0][:l_max])  # no ground truth: not scored
    return chains, truth, l_max


AGREEMENT_KEYS = ("accuracy", "accuracy_all", "coverage")


def check_chain_agreement(fn: Callable, seeds: Iterable[int] = PRACTICE_SEEDS) -> None:
    """`fn(chains, truth, l_max)` -> one dict per level 1..l_max with accuracy, accuracy_all and coverage, as
    `chain_agreement` computes them (canonical names compared; rounding to 4 decimals is allowed)."""
    for seed in seeds:
        chains, truth, l_max = agreement_case(seed)
        answer = fn({i: list(c) for i, c in chains.items()}, {i: list(c) for i, c in truth.items()}, l_max)
        if not isinstance(answer, list) or len(answer) != l_max or not all(isinstance(r, dict) for r in answer):
            raise CheckFailed(f"return a list of {l_max} dicts, one per level 1..l_max; got "
                              f"{type(answer).__name__} of length {len(answer) if hasattr(answer, '__len__') else '?'}")
        expected = chain_agreement(chains, truth, l_max)
        for level, (row, reference) in enumerate(zip(answer, expected), start=1):
            missing = [k for k in AGREEMENT_KEYS if k not in row]
            if missing:
                raise CheckFailed(f"level {level}: keys {missing} missing; each row holds {', '.join(AGREEMENT_KEYS)}")
            for key in AGREEMENT_KEYS:
                yours = float(row[key])
                if abs(yours - reference[key]) <= 1e-4:
                    continue
                scored = [i for i in truth if i in chains]
                hint = {"coverage": "coverage is the share of ground-truth images that have a chain (predictions for "
                                    "images without ground truth do not count)",
                        "accuracy": f"accuracy divides the right answers by the {len(scored)} ground-truth images "
                                    "that have a chain",
                        "accuracy_all": f"accuracy_all divides the right answers by all {len(truth)} ground-truth "
                                        "images (a missing chain counts as wrong)"}[key]
                raw_right = sum(1 for i in scored if len(chains[i]) >= level and chains[i][level - 1]
                                == truth[i][level - 1])
                denominator = len(scored) if key == "accuracy" else len(truth)
                if key != "coverage" and abs(yours - raw_right / max(1, denominator)) <= 1e-4:
                    hint = ("you compared the names as written: compare canonical names (canonicalize both), so "
                            "'Celebrations' and 'celebration' agree")
                elif key != "coverage" and abs(yours * denominator - round(yours * denominator)) > 1e-3 \
                        and abs(yours * len(chains) - round(yours * len(chains))) < 1e-3:
                    hint += f"; you divided by all {len(chains)} predicted chains, some of which have no ground truth"
                raise CheckFailed(f"level {level}, {key}: {difference(yours, reference[key])} (seeded case {seed}: "
                                  f"{len(truth)} ground-truth images, {len(scored)} with a chain)\n  hint: {hint}")
    passed("your chain agreement", seeds)
