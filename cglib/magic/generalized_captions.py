"""Generalized captions (LLM_gen, Algorithm 1): for each l1 node, captions that keep what the group shares.

The requests go through the abstraction engine (`cglib.llm.generalize_groups`: its backends, cache, retries
and failure accounting). Each request carries the node's concept, its primary ancestors' names (l2..l_max) and
the original captions of its *training* images (`magic.generalize_from: train`, so a test image's captions never
shape the text its group is trained and queried with; a held-out concept, which has no training images, uses
all of its images). The engine itself shows the LLM at most `llm.generalize_max_captions` of them (its seeded
sample), so every caption is passed on.

A node whose generalization failed is kept, not dropped: dropping it would remove its images from training and
from every other evaluation column because of an LLM failure that says nothing about the images. Its
`generalized_captions` hold the first n of the captions it was sent, `generalized_fallback` is True, and the
failures are counted per reason in the stats, so evaluation can leave flagged nodes out of the
generalized-caption column.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cglib.config import Params
from cglib.magic.schema import MagicFile

Generalizer = Callable[..., Any]  # (requests, params, run_dir, progress=...) -> object with .captions, .failures


def _group_request_type() -> type:
    try:
        from cglib.llm import GroupRequest
    except ImportError:  # the engine's package exports it from base while it is being assembled
        from cglib.llm.base import GroupRequest
    return GroupRequest


def group_requests(magic: MagicFile, n: int, source: str) -> list:
    """One GroupRequest per l1 node with images (sorted by node id)."""
    request = _group_request_type()
    out = []
    for node in magic.groups():
        image_ids = magic.images_of(node, "train") if source == "train" else []
        image_ids = image_ids or magic.images_of(node)
        captions = [c for i in image_ids for c in magic.images[i].captions]
        parents = [magic.nodes[p].name for p in magic.chain(image_ids[0])[1:]]
        out.append(request(group_id=node, concept=magic.nodes[node].name, parents=parents, captions=captions, n=n))
    return out


def _failure_reasons(failures: Any) -> dict[str, str]:
    """group id -> reason from the engine's failure list (objects with item_id/reason, or a mapping)."""
    if not failures:
        return {}
    if isinstance(failures, dict):
        return {str(k): str(v) for k, v in failures.items()}
    out = {}
    for f in failures:
        item = getattr(f, "item_id", None) or (f.get("item_id") if isinstance(f, dict) else None)
        reason = getattr(f, "reason", None) or (f.get("reason") if isinstance(f, dict) else None)
        if item is not None:
            out[str(item)] = str(reason or "failed")
    return out


def add_generalized_captions(magic: MagicFile, generalizer: Generalizer, params: Params, run_dir: Path | None,
                             progress: bool = True) -> dict:
    """Fill `generalized_captions` of every l1 node in place; returns the counts for `stats['generalization']`."""
    m = params.magic
    n = params.llm.generalized_captions_per_node
    requests = group_requests(magic, n, m.generalize_from)
    result = generalizer(requests, params, run_dir, progress=progress)
    captions: dict[str, list[str]] = dict(getattr(result, "captions", {}) or {})
    reasons = _failure_reasons(getattr(result, "failures", None))
    failed = Counter()
    for req in requests:
        node = magic.nodes[req.group_id]
        got = [c for c in captions.get(req.group_id, []) if isinstance(c, str) and c.strip()]
        if got:
            node.generalized_captions = got
            node.generalized_fallback = False
        else:
            node.generalized_captions = list(dict.fromkeys(req.captions))[:n]
            node.generalized_fallback = True
            failed[reasons.get(req.group_id, "no captions returned")] += 1
    summary = getattr(result, "summary", None)
    return {"requested": len(requests), "generalized": len(requests) - sum(failed.values()),
            "fallback_to_original": sum(failed.values()), "failure_reasons": dict(sorted(failed.items())),
            "captions_per_node": n, "source": m.generalize_from,
            "engine_summary": {k: v for k, v in summary.items() if k != "provenance"}
            if isinstance(summary, dict) else None}
