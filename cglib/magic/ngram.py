"""Concept groups without an LLM: caption n-grams shared by enough MAGIC-train images (`magic/ngram.json`).

The file has the `magic.json` schema (`cglib.magic.schema.MagicFile`), so the group sampler and every loss train
on it unchanged (`train.runs[i].groups: ngram`). It holds the MAGIC-train images only (its test images are never
read: mining, like training, sees train only) with their original captions and no generalized captions, so such
runs train on original captions. The rules, in order:

1. Candidates. Captions are lower-cased and split into words (`[a-z0-9]+`). An n-gram (n = 1..`ngram.n_max`) is
   a run of n consecutive words none of which is a stop word (`ngram.stop_words` + `ngram.extra_stop_words`), so
   "a red balloon in the living room" gives "red", "balloon", "red balloon", "living", "room", "living room".
   An image HAS an n-gram when any of its captions contains it; its document frequency df is its image count.
2. Filtering. An n-gram with df < min_images (`ngram.min_images`, default `magic.size_min`) is too rare; one
   with df > `ngram.max_document_fraction` x train images is too frequent (listed in the stats). N-grams with
   exactly the same image set are one group, named by the longest (ties: alphabetically first); the others are
   recorded as its aliases. What remains are the mined groups.
3. One l1 group per image (the schema attaches an image to one l1 node): the most specific group that stands
   on its own. Groups are visited rarest first (smallest df, then longest, then alphabetical); each takes those
   of its images that no rarer group took, and becomes an l1 group when they are at least min_images (else it
   takes none and is listed in `removed_from_l1`; it may still be a node above l1). An image no group took is
   counted as uncovered (`skipped`). (Measured on the synthetic world: 98.6% of train images covered, against
   76% when every image first took its rarest group and under-filled groups were removed afterwards.)
4. Levels by nesting. The nesting parent of a group is the mined group whose n-gram is the longest proper
   contiguous sub-sequence of its words (ties: fewest images, then alphabetical): "red balloon" -> "balloon".
   Its images are a superset by construction. An l1 group's chain is the group, its parent, the parent's
   parent, ...; l_max is the longest chain (at most n_max); a shorter chain repeats its top n-gram up to l_max
   (node ids carry the level, so `l2:balloon` collects `l1:balloon` and `l1:red balloon`).
5. Hard negatives between the nodes of each level: `cglib.magic.negatives.hard_negatives` on the n-grams'
   embeddings by the MAGIC concept embedder (`magic.embedder`), thresholds `magic.hard_negative_sim` and
   `magic.min_hard_negatives`, exactly as for MAGIC.

Every count (candidates, too rare, too frequent, aliases, groups removed from l1, images covered and left
without a group) is in the file's `stats["ngram"]`. `build_ngram_groups(run)` builds the file from the run's
magic.json once and reuses it while magic.json and the settings are unchanged (the trainer calls it for
`groups: ngram` runs; a notebook can call it to inspect the groups, e.g. with `ngram_table`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cglib.config import Params
from cglib.magic.embedders import Embedder, embed_names, make_embedder
from cglib.magic.files import content_digest, load_magic, save_magic
from cglib.magic.invariants import check_invariants
from cglib.magic.negatives import attach_negatives, negative_settings
from cglib.magic.schema import SCHEMA_VERSION, ImageRecord, MagicFile, Node, node_id
from cglib.run import provenance

logger = logging.getLogger(__name__)

NGRAM_FILE = "ngram.json"
SKIP_TEST = "MAGIC test image (n-grams are mined on MAGIC train only)"
SKIP_UNCOVERED = "MAGIC train image with no mined n-gram group"
_WORD = re.compile(r"[a-z0-9]+")

# Function words only (articles, prepositions, conjunctions, pronouns, auxiliaries, a few adverbs): content
# words such as "fire", "front" or number words stay candidates (scikit-learn's list removes them).
SHIPPED_STOP_WORDS = frozenset([
    "a", "an", "the", "and", "or", "but", "nor", "so", "yet", "of", "in", "on", "at", "to", "for", "from", "by",
    "with", "without", "within", "into", "onto", "upon", "over", "under", "above", "below", "beneath", "beside",
    "besides", "between", "among", "around", "about", "against", "along", "across", "behind", "near", "next",
    "through", "during", "before", "after", "up", "down", "out", "off", "than", "then", "as", "like", "is", "are",
    "was", "were", "be", "been", "being", "am", "has", "have", "had", "having", "do", "does", "did", "it", "its",
    "this", "that", "these", "those", "there", "here", "their", "theirs", "them", "they", "he", "she", "him",
    "her", "his", "hers", "we", "us", "our", "ours", "you", "your", "yours", "i", "me", "my", "mine", "who",
    "whom", "whose", "which", "what", "where", "when", "while", "how", "why", "some", "any", "each", "every",
    "all", "both", "either", "neither", "no", "not", "very", "just", "also", "too", "can", "could", "will",
    "would", "shall", "should", "may", "might", "must", "s", "t"
])


def stop_word_set(params: Params) -> frozenset[str]:
    """The stop words of `ngram.stop_words` plus `ngram.extra_stop_words` (lower case)."""
    g = params.ngram
    if g.stop_words == "sklearn":
        try:
            from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
        except ImportError:
            raise ImportError("ngram.stop_words: sklearn needs scikit-learn; install it or set "
                              "ngram.stop_words: shipped") from None
        base = frozenset(ENGLISH_STOP_WORDS)
    else:
        base = SHIPPED_STOP_WORDS
    return base | {w.strip().lower() for w in g.extra_stop_words if w.strip()}


def caption_ngrams(caption: str, n_max: int, stop_words: frozenset[str]) -> set[str]:
    """The n-grams (n = 1..n_max) of consecutive words of a caption, none of whose words is a stop word."""
    words = _WORD.findall(caption.lower())
    found = set()
    for start in range(len(words)):
        for n in range(1, n_max + 1):
            gram = words[start:start + n]
            if len(gram) < n or gram[-1] in stop_words:
                break
            if gram[0] in stop_words:
                break
            found.add(" ".join(gram))
    return found


def _rank(name: str, df: int) -> tuple[int, int, str]:
    """Sort key of 'most specific first': fewest images, then most words, then alphabetical."""
    return df, -len(name.split()), name


@dataclass
class Mined:
    """What mining found: the groups (n-gram -> its sorted image ids) and everything left out, counted."""

    groups: dict[str, list[str]]
    candidates: int
    too_rare: int
    too_frequent: dict[str, int]
    aliases: dict[str, list[str]] = field(default_factory=dict)


def mine_ngrams(captions: dict[str, list[str]], n_max: int, min_images: int, max_document_fraction: float,
                stop_words: frozenset[str]) -> Mined:
    """Rules 1-2 of the module docstring on `captions` (image id -> its captions; train images only)."""
    images: dict[str, set[str]] = {}
    for image_id in sorted(captions):
        grams = set().union(*(caption_ngrams(c, n_max, stop_words) for c in captions[image_id]))
        for gram in grams:
            images.setdefault(gram, set()).add(image_id)
    limit = max_document_fraction * len(captions)
    too_frequent = {g: len(ids) for g, ids in images.items() if len(ids) > limit and len(ids) >= min_images}
    too_rare = sum(1 for ids in images.values() if len(ids) < min_images)
    kept = {g: ids for g, ids in images.items() if min_images <= len(ids) <= limit}
    # identical image sets are one group: the longest n-gram names it (ties: alphabetically first)
    by_set: dict[frozenset[str], list[str]] = {}
    for g in sorted(kept):
        by_set.setdefault(frozenset(kept[g]), []).append(g)
    groups, aliases = {}, {}
    for names in by_set.values():
        name = min(names, key=lambda g: (-len(g.split()), g))
        groups[name] = sorted(kept[name])
        if len(names) > 1:
            aliases[name] = sorted(n for n in names if n != name)
    return Mined(dict(sorted(groups.items())), len(images), too_rare,
                 dict(sorted(too_frequent.items(), key=lambda kv: (-kv[1], kv[0]))), dict(sorted(aliases.items())))


def attach_images(groups: dict[str, list[str]], min_images: int) -> tuple[dict[str, str], list[str]]:
    """Rule 3: each image's l1 group (image id -> n-gram) and the groups that are not l1 groups, in rank order.

    Groups are visited rarest first (fewest images, then longest, then alphabetical); a group takes those of its
    images that no rarer group took, and is kept when they are at least min_images, else it takes none. So an
    image lies in its most specific group that can hold min_images images on their own.
    """
    attached: dict[str, str] = {}
    removed: list[str] = []
    for g in sorted(groups, key=lambda name: _rank(name, len(groups[name]))):
        free = [i for i in groups[g] if i not in attached]
        if len(free) >= min_images:
            attached.update(dict.fromkeys(free, g))
        else:
            removed.append(g)
    return dict(sorted(attached.items())), removed


def nesting_parent(name: str, groups: dict[str, list[str]]) -> str | None:
    """Rule 4: the mined group of the longest proper contiguous sub-sequence of `name`'s words (fewest images,
    then alphabetical, among equals); None when there is none."""
    words = name.split()
    for n in range(len(words) - 1, 0, -1):
        subs = {" ".join(words[s:s + n]) for s in range(len(words) - n + 1)}
        found = [g for g in subs if g in groups]
        if found:
            return min(found, key=lambda g: (len(groups[g]), g))
    return None


def _chain(name: str, groups: dict[str, list[str]]) -> list[str]:
    chain = [name]
    while (parent := nesting_parent(chain[-1], groups)) is not None:
        chain.append(parent)
    return chain


def ngram_magic(magic: MagicFile, params: Params, embedder: Embedder | None = None) -> MagicFile:
    """The n-gram groups of `magic`'s train images as a validated MagicFile (see the module docstring)."""
    g = params.ngram
    min_images = g.min_images or params.magic.size_min
    started = time.perf_counter()
    train = {i: list(magic.images[i].captions) for i in magic.split_ids("train")}
    if not train:
        raise ValueError("the MAGIC file has no train images to mine n-grams from; rebuild it with 03_magic_dag")
    mined = mine_ngrams(train, g.n_max, min_images, g.max_document_fraction, stop_word_set(params))
    attached, removed = attach_images(mined.groups, min_images)
    if not attached:
        raise ValueError(f"no n-gram is shared by {min_images} to {g.max_document_fraction:.0%} of the "
                         f"{len(train)} MAGIC-train images; lower ngram.min_images (or magic.size_min) or raise "
                         "ngram.max_document_fraction")
    chains = {name: _chain(name, mined.groups) for name in sorted(set(attached.values()))}
    l_max = max(len(c) for c in chains.values())
    chains = {name: c + [c[-1]] * (l_max - len(c)) for name, c in chains.items()}

    edges: dict[str, Counter] = {}
    for name in attached.values():
        chain = chains[name]
        for level in range(1, l_max + 1):
            nid = node_id(level, chain[level - 1])
            edges.setdefault(nid, Counter())
            if level < l_max:
                edges[nid][node_id(level + 1, chain[level])] += 1
    under = Counter(node_id(level, chains[name][level - 1]) for name in attached.values()
                    for level in range(1, l_max + 1))
    nodes = {}
    for nid in sorted(edges):
        level, name = int(nid.split(":", 1)[0][1:]), nid.split(":", 1)[1]
        parents = dict(edges[nid])
        nodes[nid] = Node(id=nid, level=level, name=name, parents=parents,
                          primary_parent=min(parents, key=lambda p: (-parents[p], p)) if parents else None,
                          n_images=under[nid])
    embed = embedder or make_embedder(params)
    vectors = embed_names(embed, [n.name for n in nodes.values()])
    m = params.magic
    searches = attach_negatives(nodes, {n: vectors[node.name] for n, node in nodes.items()}, m,
                                threads=params.run.threads or None)
    images = {i: ImageRecord(id=i, node=node_id(1, attached[i]), captions=train[i], split="train")
              for i in sorted(attached)}
    n_test = len(magic.images) - len(train)
    uncovered = len(train) - len(attached)
    skipped = {k: v for k, v in ((SKIP_TEST, n_test), (SKIP_UNCOVERED, uncovered)) if v}
    sizes = sorted(Counter(attached.values()).values())
    stats = {"ngram": {
        "settings": {"n_max": g.n_max, "min_images": min_images, "max_document_fraction": g.max_document_fraction,
                     "stop_words": g.stop_words, "extra_stop_words": sorted(g.extra_stop_words),
                     "embedder": m.embedder, "hard_negative_sim": m.hard_negative_sim,
                     "min_hard_negatives": m.min_hard_negatives, "max_hard_negatives": m.max_hard_negatives,
                     **negative_settings(searches, m)},
        "train_images": len(train), "images_covered": len(attached), "images_without_group": uncovered,
        "test_images_left_out": n_test, "candidate_ngrams": mined.candidates,
        "too_rare": mined.too_rare, "too_frequent": mined.too_frequent, "aliases": mined.aliases,
        "mined_groups": len(mined.groups), "l1_groups": len(chains), "removed_from_l1": removed,
"l1_nested": sum(1 for name in chains if len(_chain(name, mined.groups)) > 1),
        "l1_images_min": sizes[0], "l1_images_median": float(np.median(sizes)), "l1_images_max": sizes[-1],
        "nodes_per_level": {str(k): sum(1 for n in nodes.values() if n.level == k) for k in range(1, l_max + 1)},
        "seconds": round(time.perf_counter() - started, 3)}}
    out = MagicFile(schema_version=SCHEMA_VERSION, l_max=l_max, split_kind=magic.split_kind, generalize="group",
                    nodes=nodes, images=images, skipped=skipped, stats=stats)
    check_invariants(out)
    return out


def ngram_key(magic_path: Path, params: Params) -> str:
    """What the n-gram file depends on: magic.json's content, the ngram section and the hard-negative settings."""
    m = params.magic
    settings = {"ngram": params.ngram.model_dump(mode="json"), "size_min": m.size_min, "embedder": m.embedder,
                "embedder_model": m.embedder_model, "hard_negative_sim": m.hard_negative_sim,
                "hard_negative_coverage": m.hard_negative_coverage, "min_hard_negatives": m.min_hard_negatives, "max_hard_negatives": m.max_hard_negatives,
                "negative_search": m.negative_search}
    digest = hashlib.sha1(content_digest(load_magic(magic_path)).encode())
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def ngram_path(run) -> Path:
    """Where a run keeps its n-gram groups: `<run>/magic/ngram.json` (beside magic.json)."""
    return Path(run.dir) / "magic" / NGRAM_FILE


def build_ngram_groups(run, embedder: Embedder | None = None, force: bool = False) -> MagicFile:
    """The run's n-gram groups: `magic/ngram.json`, built from its magic.json when absent or out of date."""
    magic_path = run.require("magic/magic.json", "03_magic_dag")
    path = ngram_path(run)
    key = ngram_key(magic_path, run.params)
    if path.is_file() and not force:
        cached = load_magic(path)
        if cached.provenance.get("ngram_key") == key:
            return cached
    started = time.perf_counter()
    out = ngram_magic(load_magic(magic_path), run.params, embedder)
    out.provenance = provenance(run.params, stage="ngram", ngram_key=key,
                                built_s=round(time.perf_counter() - started, 3))
    save_magic(out, path)
    s = out.stats["ngram"]
    logger.info("n-gram groups: %d l1 groups over %d levels, %d of %d train images covered", s["l1_groups"],
                out.l_max, s["images_covered"], s["train_images"])
    return out


def ngram_table(magic: MagicFile, level: int = 1, top: int | None = None):
    """A pandas table of one level's n-gram nodes: name, images, parent, hard negatives (largest first)."""
    rows = [{"ngram": n.name, "images": n.n_images, "parent": n.primary_parent,
             "hard_negatives": len(n.hard_negatives), "children": len(magic.children(n.id))}
            for n in magic.nodes_at(level)]
    table = pd.DataFrame(rows).sort_values(["images", "ngram"], ascending=[False, True]).reset_index(drop=True)
    return table if top is None else table.head(top)
