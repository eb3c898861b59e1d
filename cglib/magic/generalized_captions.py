"""The DAG step LLM_gen (Algorithm 1, PAPER_NOTES step 5): build the generalized-caption requests from a built
MAGIC file and store the answers in it. The requests themselves go through the abstraction engine
(`cglib.llm.generalize_groups` in `cglib.llm.generalize_requests`: its backends, cache, retries and failure
accounting).

`magic.generalize` chooses the granularity:

- `image` (our default; the paper's step list, "a generalized caption for each image based on the concept of its
  node"; the authors' training reads each image's own `new_captions`): one request per image of EVERY
  split (test images need theirs: Table 3's first column scores them), carrying only that image's own captions,
  its l1 concept and the concept's primary ancestors (l2..l_max); `llm.generalized_captions_per_image` captions
  each, stored in `ImageRecord.generalized_captions`. A test image's request shows nothing of another image.
- `level` (as published: the authors' `generate_new_caption.py`): per image, one request per level l1..l_max
  with the image's captions and that level's concept alone, one caption each (their prompt's temperature 0.7
  is the prompt file's); the image's captions are its level captions in level order.
- `group` (Algorithm 1 as printed; the project's first version): one request per l1 node with the original
  captions of its *training* images (`magic.generalize_from: train`, so a test image's captions never shape the
  text its group is trained and queried with; a held-out concept, which has no training images, uses all of its
  images); `llm.generalized_captions_per_node` captions in `Node.generalized_captions`.

Readers never choose: `MagicFile.generalized_texts(image_id)` returns the texts that pair with an image.

A unit (image or node) whose generalization failed is kept, not dropped: dropping it would remove images from
training and from every other evaluation column because of an LLM failure that says nothing about the images.
Its `generalized_captions` hold the first n of its own original captions, `generalized_fallback` is True, and the
failures are counted per reason in the stats, so evaluation leaves flagged units out of the generalized-caption
column (and counts them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cglib.config import Params
from cglib.llm.base import GroupRequest, image_caption_requests
from cglib.magic.schema import MagicFile

Generalizer = Callable[..., Any]  # (requests, params, run_dir, progress=...) -> object with .captions, .failures


def group_requests(magic: MagicFile, n: int, source: str) -> list[GroupRequest]:
    """One request per l1 node with images (sorted by node id): its pooled captions, concept and ancestors."""
    out = []
    for node in magic.groups():
        image_ids = magic.images_of(node, "train") if source == "train" else []
        image_ids = image_ids or magic.images_of(node)
        captions = [c for i in image_ids for c in magic.images[i].captions]
        parents = [magic.nodes[p].name for p in magic.chain(image_ids[0])[1:]]
        out.append(GroupRequest(group_id=node, concept=magic.nodes[node].name, parents=parents, captions=captions,
                                n=n))
    return out


def image_requests(magic: MagicFile, n: int, mode: str = "image") -> dict[str, list[GroupRequest]]:
    """Image id -> its requests, for every image of every split (sorted by image id): one with its own
    captions, l1 concept and ancestors (mode image), or one per level with that level's concept (mode level)."""
    return {image_id: image_caption_requests(image_id, list(magic.images[image_id].captions),
                                             magic.chain_names(image_id), mode, n)
            for image_id in sorted(magic.images)}


def _failure_reasons(failures: Any) -> dict[str, str]:
    """item id -> reason from the engine's failure list (objects with item_id/reason, or a mapping)."""
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
    """Fill the generalized captions of every image (magic.generalize: image, level) or l1 node (group) in place
    and set `magic.generalize`; returns the counts for `stats['generalization']`.

    With `level`, an image's captions are its level captions l1..l_max in order (the authors' `level_captions`);
    a level whose request failed is left out and counted, and an image keeps the fallback only when every
    level failed.
    """
    m = params.magic
    per_image = m.generalize != "group"
    n = params.llm.generalized_captions_per_image if per_image else params.llm.generalized_captions_per_node
    if per_image:
        by_unit = image_requests(magic, n, m.generalize)
        units = {i: magic.images[i] for i in by_unit}
    else:
        by_unit = {r.group_id: [r] for r in group_requests(magic, n, m.generalize_from)}
        units = {g: magic.nodes[g] for g in by_unit}
    requests = [r for unit_requests in by_unit.values() for r in unit_requests]
    magic.generalize = m.generalize
    result = generalizer(requests, params, run_dir, progress=progress)
    captions: dict[str, list[str]] = dict(getattr(result, "captions", {}) or {})
    reasons = _failure_reasons(getattr(result, "failures", None))
    failed: Counter = Counter()  # per unit that fell back (every request of it failed)
    failed_levels: Counter = Counter()  # mode level: per level request that failed in a unit that did not
    for unit_id, unit_requests in by_unit.items():
        unit, got, unit_failures = units[unit_id], [], []
        for req in unit_requests:
            texts = [c for c in captions.get(req.group_id, []) if isinstance(c, str) and c.strip()]
            got += texts
            if not texts:
                unit_failures.append(reasons.get(req.group_id, "no captions returned"))
        if got:
            unit.generalized_captions = got
            unit.generalized_fallback = False
            failed_levels.update(unit_failures)
        else:  # kept with copies of its own original captions, flagged and counted (see the module docstring)
            unit.generalized_captions = list(dict.fromkeys(unit_requests[0].captions))[:n]
            unit.generalized_fallback = True
            failed[unit_failures[0]] += 1
    summary = getattr(result, "summary", None)
    counts = {"mode": m.generalize, "unit": "image" if per_image else "l1 node", "requested": len(requests),
              "generalized": len(by_unit) - sum(failed.values()), "fallback_to_original": sum(failed.values()),
              "failure_reasons": dict(sorted(failed.items())),
              "captions_per_image" if per_image else "captions_per_node": n if m.generalize != "level" else
              f"1 per level (l1..l{magic.l_max})",
              "source": "own captions" if per_image else m.generalize_from,
              "engine_summary": {k: v for k, v in summary.items() if k != "provenance"}
              if isinstance(summary, dict) else None}
    if m.generalize == "level":
        counts["levels_failed_in_generalized_images"] = dict(sorted(failed_levels.items()))
    return counts
