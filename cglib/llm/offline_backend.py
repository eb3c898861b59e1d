"""The `offline` and `oracle` backends: no network, same interface and outputs as the LLM backend.

offline: an image's captions are embedded with the offline MiniLM model (mean of the caption embeddings,
normalized) and matched to the nearest l1 concept of the shipped taxonomy by cosine; levels 2..l_max follow
the taxonomy's parents. What an l1 concept is represented by is `llm.offline_method`:
  name          the embedding of the l1 name ("birthday party")
  photo         "a photo of a birthday party"
  content       the scene's settings and objects ("a living room with cake, balloon, gift box, ..."), the
                mean over its settings
  name+content  the normalized sum of name and content
`compare_offline_methods` measures all four against the synthetic world's ground truth (notebook 02 shows
the table; `content` agrees best there, see the docs of that function). The taxonomy is `llm.offline_taxonomy`:
the synthetic world's (default), `everyday` for real photographs (COCO's kind of scenes; `content` is then each
concept's caption-like description), or a user's file. `taxonomy_fit` measures, without ground truth, how well a
taxonomy's concepts fit a set of photos (notebook 02).

oracle: the synthetic world's ground-truth chains, for controlled experiments only (results are marked with
backend 'oracle'); it makes no requests and is not cached.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from cglib.config import Params
from cglib.data.taxonomy import Taxonomy, load_taxonomy
from cglib.embed import MINILM_DIM, embed_texts
from cglib.llm.base import Backend, ConceptTask, Job, Outcome, Report
from cglib.llm.canonical import canonicalize

OFFLINE_METHODS = ("name", "photo", "content", "name+content")
ENCODER = "all-MiniLM-L6-v2"


def taxonomy_fingerprint(taxonomy: Taxonomy) -> str:
    """Short hash of a taxonomy's content (part of the offline backend's model name, hence of its cache keys)."""
    content = {"levels": taxonomy.levels, "parents": taxonomy.parents,
               "scenes": {k: [list(v.settings), list(v.objects)] for k, v in taxonomy.scenes.items()}}
    if taxonomy.descriptions:  # absent for the synthetic world's file, whose hash (and cache keys) stay as they were
        content["descriptions"] = taxonomy.descriptions
    blob = json.dumps(content, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def prototype_texts(taxonomy: Taxonomy, method: str) -> dict[str, list[str]]:
    """Texts whose mean embedding represents each l1 concept under `method`."""
    if method not in OFFLINE_METHODS:
        raise ValueError(f"unknown offline method '{method}'; choose one of {', '.join(OFFLINE_METHODS)}")
    texts: dict[str, list[str]] = {}
    for name in taxonomy.l1:
        scene = taxonomy.scenes.get(name)
        content = ([f"{_article(s)} {s} with {', '.join(scene.objects)}" for s in scene.settings] if scene
                   else [taxonomy.descriptions[name]])  # a real-photo taxonomy: its caption-like description
        texts[name] = {"name": [name], "photo": [f"a photo of {_article(name)} {name}"], "content": content,
                       "name+content": [name]}[method]
    return texts


def _normalize(m: np.ndarray) -> np.ndarray:
    return m / np.maximum(np.linalg.norm(m, axis=-1, keepdims=True), 1e-12)


def l1_prototypes(taxonomy: Taxonomy, method: str) -> tuple[list[str], np.ndarray]:
    """The l1 names and their normalized prototype embeddings (n_l1, 384) under `method`."""
    names = taxonomy.l1
    if method == "name+content":
        _, by_name = l1_prototypes(taxonomy, "name")
        _, by_content = l1_prototypes(taxonomy, "content")
        return names, _normalize(by_name + by_content)
    texts = prototype_texts(taxonomy, method)
    flat = [t for n in names for t in texts[n]]
    vectors = embed_memo(flat)
    out, start = [], 0
    for n in names:
        out.append(vectors[start:start + len(texts[n])].mean(axis=0))
        start += len(texts[n])
    return names, _normalize(np.stack(out))


_MEMO: dict[str, np.ndarray] = {}
MEMO_MAX_TEXTS = 100_000  # ~150 MB of float32: enough for a demo run, never the whole of COCO


def embed_memo(texts: list[str]) -> np.ndarray:
    """MiniLM embeddings of `texts`, remembering up to MEMO_MAX_TEXTS in this process (the notebook embeds the
    same captions for the run and for the method comparison)."""
    todo = list(dict.fromkeys(t for t in texts if t not in _MEMO))
    fresh = dict(zip(todo, embed_texts(todo))) if todo else {}
    if len(_MEMO) + len(fresh) <= MEMO_MAX_TEXTS:
        _MEMO.update(fresh)
    if not texts:
        return np.zeros((0, MINILM_DIM), dtype=np.float32)
    return np.stack([fresh[t] if t in fresh else _MEMO[t] for t in texts])


def caption_means(caption_lists: list[list[str]]) -> np.ndarray:
    """Per image, the normalized mean MiniLM embedding of its captions (each distinct text embedded once)."""
    unique = list(dict.fromkeys(c for caps in caption_lists for c in caps))
    row = {t: i for i, t in enumerate(unique)}
    vectors = embed_memo(unique)
    if not caption_lists:
        return np.zeros((0, vectors.shape[1]), dtype=np.float32)
    return _normalize(np.stack([vectors[[row[c] for c in caps]].mean(axis=0) for caps in caption_lists]))


class OfflineBackend(Backend):
    """Nearest l1 concept of the taxonomy by caption embedding, then the taxonomy's parents."""

    name = "offline"
    prompt_version = None  # no prompts
    streaming = False  # answers a whole level at once

    def __init__(self, params: Params, taxonomy: Taxonomy | None = None) -> None:
        self.taxonomy = taxonomy or load_taxonomy(params.llm.offline_taxonomy)
        if params.magic.l_max != self.taxonomy.levels:
            raise ValueError(f"magic.l_max is {params.magic.l_max} but the taxonomy has {self.taxonomy.levels} "
                             f"levels; the offline backend can only follow the taxonomy: set magic.l_max: "
                             f"{self.taxonomy.levels} or use llm.backend: openai")
        self.method = params.llm.offline_method
        self.model = f"{ENCODER}/{self.method}/taxonomy-{taxonomy_fingerprint(self.taxonomy)}"
        canonical = {name: canonicalize(name) for name in self.taxonomy.all_names()}
        clashes = len(set(canonical.values())) != len(canonical)
        if clashes:
            raise ValueError("taxonomy: two concept names have the same canonical form; rename one of them")
        self.l1_names = [canonical[n] for n in self.taxonomy.l1]
        self.parent = {canonical[c]: canonical[p] for c, p in self.taxonomy.parents.items()}
        self._prototypes: np.ndarray | None = None

    def payload(self, task: ConceptTask) -> dict:
        if task.level == 1:
            return {"level": 1, "captions": list(task.captions)}
        return {"level": task.level, "chain": list(task.chain)}

    def prototypes(self) -> np.ndarray:
        if self._prototypes is None:
            self._prototypes = l1_prototypes(self.taxonomy, self.method)[1]
        return self._prototypes

    async def run(self, jobs: list[Job], report: Report) -> None:
        first = [j for j in jobs if j.task.level == 1]
        if first:
            scores = caption_means([list(j.task.captions) for j in first]) @ self.prototypes().T
            order = np.argsort(-scores, axis=1)
            for job, s, o in zip(first, scores, order):
                best, second = int(o[0]), int(o[1]) if len(o) > 1 else int(o[0])
                report(job, Outcome(ok=True, value=self.l1_names[best],
                                    meta={"score": round(float(s[best]), 4),
                                          "margin": round(float(s[best] - s[second]), 4)}))
        for job in (j for j in jobs if j.task.level > 1):
            parent = self.parent.get(job.task.chain[-1])
            if parent is None:
                report(job, Outcome.failure("invalid_concept", f"'{job.task.chain[-1]}' has no parent in the "
                                                               "taxonomy"))
            else:
                report(job, Outcome(ok=True, value=parent))


class OracleBackend(Backend):
    """The ground-truth chain of each image (synthetic world only); marked 'oracle' everywhere."""

    name = "oracle"
    model = "ground-truth"
    prompt_version = None
    streaming = False
    cacheable = False  # a lookup: nothing to save, and a new world may reuse image ids

    def __init__(self, params: Params, ground_truth: dict[str, list[str]] | None) -> None:
        if ground_truth is None:
            raise ValueError("llm.backend 'oracle' needs the ground truth: pass "
                             "ground_truth=load_ground_truth(run.stage('captions')) (synthetic world only)")
        lengths = {len(c) for c in ground_truth.values()}
        if lengths and lengths != {params.magic.l_max}:
            raise ValueError(f"ground-truth chains have {sorted(lengths)} levels but magic.l_max is "
                             f"{params.magic.l_max}; set magic.l_max to the world's number of levels")
        self.truth = {k: [canonicalize(c) for c in v] for k, v in ground_truth.items()}

    def payload(self, task: ConceptTask) -> dict:
        return {"image_id": task.item_id, "level": task.level}

    async def run(self, jobs: list[Job], report: Report) -> None:
        for job in jobs:
            chain = self.truth.get(job.task.item_id)
            if chain is None:
                report(job, Outcome.failure("no_ground_truth", f"image {job.task.item_id} has no ground-truth chain",
                                            cacheable=False))
            else:
                report(job, Outcome(ok=True, value=chain[job.task.level - 1]))


def compare_offline_methods(captions: dict[str, list[str]], ground_truth: dict[str, list[str]],
                            taxonomy: Taxonomy | None = None) -> list[dict[str, Any]]:
    """Accuracy of the offline l1 choice under every `llm.offline_method` against ground-truth l1 concepts.

    Captions are embedded once and scored against each prototype set; rows: method, l1 accuracy, images.
    """
    taxonomy = taxonomy or load_taxonomy()
    ids = [i for i in captions if i in ground_truth]
    means = caption_means([captions[i] for i in ids])
    truth = [canonicalize(ground_truth[i][0]) for i in ids]
    rows = []
    for method in OFFLINE_METHODS:
        names, protos = l1_prototypes(taxonomy, method)
        picked = [canonicalize(names[k]) for k in np.argmax(means @ protos.T, axis=1)]
        accuracy = float(np.mean([p == t for p, t in zip(picked, truth)])) if ids else float("nan")
        rows.append({"method": method, "l1_accuracy": round(accuracy, 4), "images": len(ids)})
    return rows


def taxonomy_fit(captions: dict[str, list[str]], taxonomy: Taxonomy, method: str = "content", seed: int = 0
                 ) -> dict[str, Any]:
    """How well a taxonomy fits photos without ground truth: the share of images whose chosen l1 concept is closer
    to the image's own captions than to the captions of a random other image.

    Each image gets its nearest l1 concept (as the offline backend picks it); the other image is a seeded
    derangement, so every image is compared once. A taxonomy that fits gives specific concepts (near 100%); one
    that does not sends most photos to a few vague concepts that are as close to any other photo (near 50%).
    """
    ids = sorted(i for i in captions if captions[i])
    if len(ids) < 2:
        raise ValueError(f"taxonomy_fit needs at least 2 images with captions, got {len(ids)}")
    means = caption_means([captions[i] for i in ids])
    names, prototypes = l1_prototypes(taxonomy, method)
    chosen = np.argmax(means @ prototypes.T, axis=1)
    rng = np.random.default_rng(seed)
    other = (np.arange(len(ids)) + rng.integers(1, len(ids), size=len(ids))) % len(ids)  # never the image itself
    own = np.einsum("ij,ij->i", means, prototypes[chosen])
    rival = np.einsum("ij,ij->i", means[other], prototypes[chosen])
    return {"images": len(ids), "l1_concepts": len(names), "l1_concepts_used": len(set(chosen.tolist())),
            "fit": round(float(np.mean(own > rival)), 4), "mean_margin": round(float(np.mean(own - rival)), 4)}
