"""The abstraction's output and its tables: chains.jsonl (one row per image, written atomically, read back with the
failures left out), and the per-level tables notebook 02 shows (distinct concepts, agreement with a ground truth,
copies of the few-shot examples, failures by reason)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from cglib.config import Params
from cglib.llm.base import Backend, Failure
from cglib.llm.canonical import canonicalize
from cglib.llm.prompts import few_shot_chains, load_prompts
from cglib.strict_yaml import NotTextError, read_text


def write_chains(path: Path, image_ids: list[str], chains: dict[str, list[str]], failures: dict[str, Failure],
                 backend: Backend) -> Path:
    """Write chains.jsonl (one JSON object per image, dataset order) atomically."""
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for i in image_ids:
            fail = failures.get(i)
            row = {"image_id": i, "chain": None if fail else chains[i], "status": "failed" if fail else "ok",
                   "failure_reason": fail.reason if fail else None, "failed_level": fail.level if fail else None,
                   "backend": backend.name, "model": backend.model, "prompt_version": backend.prompt_version}
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def load_chains(path: Path) -> dict[str, list[str]]:
    """Successful chains from a chains.jsonl file: image id -> [l1, ..., l_max]."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run notebook 02_abstraction first")
    chains: dict[str, list[str]] = {}
    try:
        text = read_text(path)
    except NotTextError as exc:
        raise ValueError(f"{exc}; chains.jsonl is corrupted: re-run notebook 02_abstraction (cached answers "
                         "are reused, nothing is asked twice)") from None
    for number, line in enumerate(text.split("\n"), start=1):  # not splitlines: JSON strings may hold U+2028
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number} is not valid JSON ({exc}); re-run notebook 02_abstraction") from None
        if row.get("status") == "ok" and row.get("chain"):
            chains[str(row["image_id"])] = list(row["chain"])
    return chains


def few_shot_copies(chains: dict[str, list[str]], params: Params) -> dict[str, Any]:
    """How many chains equal a few-shot example verbatim (whole chain, and concept by concept per level)."""
    examples = few_shot_chains(load_prompts(params.llm.prompt_version), params.magic.l_max)
    full = sum(1 for c in chains.values() if list(c) in examples)
    by_level = {}
    for level in range(1, params.magic.l_max + 1):
        seen = {ex[level - 1] for ex in examples if len(ex) >= level}
        by_level[level] = sum(1 for c in chains.values() if len(c) >= level and c[level - 1] in seen)
    n = max(1, len(chains))
    return {"full_chain": full, "full_chain_rate": round(full / n, 4), "by_level": by_level,
            "by_level_rate": {k: round(v / n, 4) for k, v in by_level.items()}}


def level_counts(chains: dict[str, list[str]], l_max: int) -> list[dict[str, Any]]:
    """Per level: distinct concepts, the most common one and its share of images."""
    rows = []
    for level in range(1, l_max + 1):
        counts = Counter(c[level - 1] for c in chains.values() if len(c) >= level)
        top, top_n = counts.most_common(1)[0] if counts else (None, 0)
        rows.append({"level": level, "distinct_concepts": len(counts), "images": sum(counts.values()),
                     "most_common": top, "most_common_share": round(top_n / max(1, sum(counts.values())), 4)})
    return rows


def chain_agreement(chains: dict[str, list[str]], ground_truth: dict[str, list[str]], l_max: int) -> list[dict]:
    """Per level, how often the chains agree with the ground truth (canonical names compared).

    accuracy: over images that have a chain; accuracy_all: over every ground-truth image, a missing chain
    counting as wrong; coverage: share of ground-truth images with a chain.
    """
    truth = {i: [canonicalize(c) for c in chain] for i, chain in ground_truth.items()}
    have = [i for i in truth if i in chains]
    rows = []
    for level in range(1, l_max + 1):
        right = sum(1 for i in have if len(chains[i]) >= level and len(truth[i]) >= level
                    and canonicalize(chains[i][level - 1]) == truth[i][level - 1])
        rows.append({"level": level, "accuracy": round(right / max(1, len(have)), 4),
                     "accuracy_all": round(right / max(1, len(truth)), 4),
                     "coverage": round(len(have) / max(1, len(truth)), 4), "images": len(have),
                     "distinct_predicted": len({chains[i][level - 1] for i in have if len(chains[i]) >= level}),
                     "distinct_truth": len({t[level - 1] for t in truth.values() if len(t) >= level})})
    return rows


def failure_table(failures: list[Failure]) -> list[dict[str, Any]]:
    """Failures grouped by reason: count, levels, and one example (item, detail, raw reply)."""
    groups: dict[str, list[Failure]] = {}
    for f in failures:
        groups.setdefault(f.reason, []).append(f)
    return [{"reason": r, "count": len(fs), "levels": sorted({f.level for f in fs if f.level is not None}),
             "example_item": fs[0].item_id, "example_detail": fs[0].detail[:200],
             "example_raw": (fs[0].raw or "")[:200]}
            for r, fs in sorted(groups.items(), key=lambda kv: -len(kv[1]))]
