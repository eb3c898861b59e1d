"""`evaluate_run`: every model of a run on identical items, every benchmark, with CIs; writes all result files.

Files under `<run>/evaluation/`:

    results.json     protocol, models (roles and exposure flags), item counts and exclusions, per-seed values,
                     every metric and paired difference, the automatic reading, the gain rows' notes, provenance
    metrics.csv      one row per model x benchmark x labels x direction x metric x level: value (the mean over
                     training seeds), CI, n, n_seeds, seed_sd (SD of the per-seed values), chance
    seeds.csv        the value of every (model, training seed) per metric row (Fig. 4's thin lines, seed_sd)
    differences.csv  paired differences between every two models on the same items, with paired CIs, p-values
                     and Holm-adjusted p-values (the family: every difference of that metric row)
    table3.csv/.md   Table 3 regenerated (percent, 95% CIs); the .md also has the paper's gain rows under it
    gains.csv        the "Avg Accuracy Gain w.r.t." rows per Table 3 column (points, relative %, paired CIs)
    scores.npz       the per-query scores behind every number (to recompute any interval or difference)
    embeddings/      per-model embedding caches
    models/<NAME>/   `evaluate_model`: one more model (and the zero-shot model for reference) on the same items,
                     the same files (its own embeddings/ cache; the zero-shot model's is the run's)

Training seeds (`train.seeds`): every trained model and the zero-shot model (the base) are scored once per
training seed (`training/seed<k>/`), on the same items; a value is the mean over the seeds and its interval the
hierarchical bootstrap (seeds, then images; bootstrap.py). A zoo model has no training seed (n_seeds 1); it is
paired with the trained models seed by seed as the same scores under each seed.

Zoo models (`eval.zoo`): frozen reference models (an open_clip name + pretrained tag, a cglib config, a local
checkpoint: a `model` section each) scored on exactly the same items, at their own input size; rows of every file,
role `zoo` (in no gain set); one whose weights cannot be loaded is skipped with a warning and listed in
results.json `zoo_skipped` and under table3.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cglib.config import ModelParams
from cglib.data.dataset import CaptionDataset, load_ground_truth
from cglib.evaluate import report
from cglib.evaluate.bootstrap import Scores, intervals_and_differences, repeat_seeds, stack_seeds
from cglib.evaluate.clustering import clustering_scores, seen_concepts
from cglib.evaluate.embeddings import (
    Embeddings,
    EmbeddingStore,
    file_fingerprints,
    pixel_fingerprint,
    tower_fingerprints,
)
from cglib.evaluate.forced_choice import (
    ForcedChoiceSet,
    pooled_scores,
    sample_forced_choice,
    score_forced_choice,
)
from cglib.evaluate.gallery import MetricScores, gallery_scores
from cglib.evaluate.hierarcaps import ROOT_TEXT, hierarchical_metric, in_batch_accuracy, level_retrieval
from cglib.evaluate.items import CAPTIONS, MagicItems, build_items
from cglib.evaluate.multiplicity import holm
from cglib.evaluate.retrieval import set_faiss_threads
from cglib.frontend import tqdm  # tqdm.auto live, a text bar left at its final count headless
from cglib.magic.schema import load_magic
from cglib.magic.stats import leakage
from cglib.models import ClipModel
from cglib.run import RunContext, provenance, seed_label, training_dir, write_json
from cglib.train.inputs import related_methods

logger = logging.getLogger(__name__)

ZERO_SHOT = "zero-shot"
RESULTS_FILE = "results.json"
METRICS_FILE = "metrics.csv"
DIFFERENCES_FILE = "differences.csv"
SCORES_FILE = "scores.npz"
GAINS_FILE = "gains.csv"
MODELS_DIR = "models"  # evaluate_model's results: evaluation/models/<NAME>/
SEEDS_FILE = "seeds.csv"
Key = tuple[str, str, str, str, str]  # benchmark, labels, direction, metric, level

PROTOCOL = {
    "forced_choice": (
        "Each test image with one of its texts of a type is put against M-1 negatives (eval.choices = M), each "
        "from a different hard-negative group of its l1 group and bringing its own image and its own text of the "
        "same type; a negative may not carry the anchor's text, nor may its text be one of the anchor's; ties "
        "count as wrong; negatives are drawn at random without replacement, per seed. Text->image: the text must "
        "score its own image strictly highest; image->text likewise. Chance = 1/M. Items that cannot get M-1 "
        "valid negatives are counted in results.json (items.forced_choice_excluded). The authors' code instead "
        "resolves ties in the anchor's favour, samples negatives with replacement, always takes the first item of "
        "the negative concept, and allows negatives whose ancestor string at l2-l4 equals the anchor's."),
    "gallery": (
        "Every distinct string of a type queries all test images (text->image) and every test image queries all "
        "distinct strings (image->text); an item is relevant when it carries the query's string (any image "
        "under a concept for concept names). R@k, and for group-level texts precision@k and mAP. Ties rank "
        "against the model."),
    "coco": "Original captions of the test images: caption->image and image->caption R@k over the test split.",
    "hierarcaps": (
        "Per level, each of the n items' texts queries all n images; a hit is an image with the same text at "
        "that level (strings repeat at levels 1-2). In-batch: each item against B-1 random other items "
        "(eval.hierarcaps_batch), R@1, resampled per seed. Hierarchy: the HierarCaps authors' precision, recall "
        "(root = empty string, eval.hierarcaps_radii radii) and Kendall tau-b of root distance vs level."),
    "uncertainty": (
        "95% (eval.ci) percentile bootstrap over test items with eval.bootstrap resamples; queries of one unit "
        "(an image's captions, one image under several seeds, a group's generalized captions) are resampled "
        "together; with eval.bootstrap_unit = group, whole l1 groups are (intervals that also cover which "
        "concepts happened to be in the test set). With several evaluation seeds the reported value is the mean over seeds (= mean over pooled "
        "(seed, item) queries) and the CI comes from resampling images with their pooled queries. With several "
        "training seeds (train.seeds) the value is the mean over the training seeds and the bootstrap is "
        "hierarchical: training seeds are resampled, then images (the same image draw under every drawn seed: "
        "the items are shared by the seeds); n_seeds says how many seeds a number rests on. Differences "
        "between models use the same resamples for both (paired at both levels: seed k against seed k)."),
    "chance": (
        "The chance column is what a random-scoring model gets on the same items, averaged over the sampling "
        "seeds (its exact expectation): 1/M in the M-way forced choice, the share of same-text images in each "
        "B-way HierarCaps batch, the expected R@k of a random ranking in a gallery."),
    "multiplicity": (
        "Each difference has a two-sided p-value from its bootstrap standard error; a reading of many cells "
        "calls a difference significant only after Holm's correction over the cells it reads (family-wise "
        "error at 1 - eval.ci)."),
}


@dataclass
class EvalResults:
    """Saved evaluation results: tidy metrics, paired differences, Table 3, and the rest of results.json."""

    metrics: pd.DataFrame
    differences: pd.DataFrame
    table3: pd.DataFrame
    info: dict
    directory: Path
    paths: dict[str, Path] = field(default_factory=dict)
    gains: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=report.GAIN_COLUMNS))
    seeds: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=report.SEED_COLUMNS))

    @property
    def models(self) -> list[str]:
        return [m["name"] for m in self.info["models"]]

    def comparisons(self) -> list[tuple[str, str]]:
        """Default comparisons: each trained model vs the zero-shot model and each group loss vs the CLIP loss."""
        models = self.info["models"]
        clip = [m["name"] for m in models if m.get("loss") == "clip"]
        pairs = [(m["name"], ZERO_SHOT) for m in models if m["name"] != ZERO_SHOT]
        pairs += [(m["name"], c) for m in models for c in clip if m.get("loss") not in (None, "clip")]
        return pairs

    def reading(self, **selection: str) -> list[str]:
        """The automatic reading of one metric (default: forced choice, text->image, DAG labels, accuracy)."""
        return report.read_results(self.metrics, self.differences, self.comparisons(), **selection)

    def table(self, benchmark: str, labels: str, direction: str, metric: str) -> pd.DataFrame:
        """Models x levels of one metric, 'value [low, high]'."""
        return report.metric_table(self.metrics, benchmark, labels, direction, metric)

    def notes(self) -> list[str]:
        """How each Table 3 column was computed, the items, the exposures (as in table3.md)."""
        return report.table3_notes(self.info)

    def gain_notes(self) -> list[str]:
        """How the gain rows under Table 3 were computed, the models in each mean, what is not significant."""
        return list((self.info.get("gains") or {}).get("notes", []))


# ------------------------------------------------------------------------------------------- inputs
def _default_loader(run: RunContext) -> Callable[..., ClipModel]:
    from cglib.train import load_trained

    device = run.device()
    return lambda name, seed=0: load_trained(run.params, run.dir, name, device=device, seed=seed)


def _seed_loader(load: Callable[..., ClipModel], seed: int) -> Callable[[str], ClipModel]:
    """`load` for one training seed: `load(name)` for seed 0 (a one-argument loader works for one-seed runs),
    `load(name, seed)` otherwise."""
    return (lambda name: load(name)) if seed == 0 else (lambda name: load(name, seed))


class ModelLoadError(RuntimeError):
    """A model to score whose weights could not be loaded (`evaluate_model`; `eval.zoo` entries are skipped)."""


def _zero_shot_info() -> dict:
    return {"name": ZERO_SHOT, "loss": None, "pretrain": "none", "exposed_to_eval_strings": False,
            "fine_tuned_on_magic": False, "objective": "none", "init": None, "weights": "base"}


def zoo_info(name: str, spec: ModelParams) -> dict:
    """A frozen reference model's entry in results.json `models`: never trained here, in no gain set."""
    return {**_zero_shot_info(), "name": name, "zoo": True, "weights": "eval.zoo", "spec": spec.model_dump(mode="json")}


def _model_info(run: RunContext) -> list[dict]:
    """The zero-shot model and every trained run, with what their training saw and their role in the gain rows
    (`report.ModelRole`: fine_tuned_on_magic, objective, pretrain, init), from each run's training summary.json
    of the first training seed (roles do not depend on the seed; the params' values where the summary does not
    say), then the zoo models (`eval.zoo`)."""
    infos = [_zero_shot_info()]
    first = run.params.train.seeds[0]
    for r in run.params.train.runs:
        relative = (training_dir(run.dir, first) / r.name / "summary.json").relative_to(run.dir)
        summary_path = run.require(str(relative), "05_training")
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        loss = summary.get("loss", r.loss)
        infos.append({"name": r.name, "loss": loss, "pretrain": summary.get("pretrain", r.pretrain),
                      "text_source": summary.get("text_source", r.text_source or run.params.train.text_source),
                      "related": related_methods(r),
                      "exposed_to_eval_strings": bool(summary.get("exposed_to_eval_strings", False)),
                      "fine_tuned_on_magic": bool(summary.get("fine_tuned_on_magic", True)),
                      "objective": summary.get("objective", loss), "init": summary.get("init", ZERO_SHOT),
                      "objective_family": summary.get("objective_family"),
                      "exposure": summary.get("exposure") or [],
                      "weights": (summary.get("weights_source") or {}).get("kind", "trained here")})
    return infos + [zoo_info(z.name, z.model) for z in run.params.eval.zoo]


def _test_pixels(run: RunContext, magic, dataset: CaptionDataset, image_size: Callable[[], int], progress: bool
                 ) -> tuple[Callable[[], np.ndarray], str, set[str], Counter]:
    """Pixels of the test images (lazy), their content fingerprint, the readable ids and skip reasons.

    In-memory datasets (the synthetic world) are used as they are; image files come from the run's image cache
    at the model's input size (the one training built, reused).
    """
    ids = magic.split_ids("test")
    skipped: Counter = Counter()
    row_of = {image_id: r for r, image_id in enumerate(dataset.image_ids)}
    missing = [i for i in ids if i not in row_of]
    if missing:
        skipped["not in the captions dataset"] += len(missing)
    present = [i for i in ids if i in row_of]
    if dataset.pixels is not None:
        pixels = dataset.pixels[[row_of[i] for i in present]]
        return (lambda: pixels), pixel_fingerprint(pixels=pixels), set(present), skipped
    from cglib.data.image_cache import magic_image_cache

    cache = magic_image_cache(run, magic, dataset, image_size(), progress)
    readable = [i for i in present if i in cache]
    for i in present:
        if i not in cache:
            skipped[cache.skipped_ids.get(i, "not in the image cache")] += 1
    fingerprint = pixel_fingerprint(files=[dataset.image_files[i] for i in readable])
    return (lambda: cache.get(readable)), fingerprint, set(readable), skipped


# ------------------------------------------------------------------------------------------ scoring
def _score_magic(items: MagicItems, emb: Embeddings, fc_sets: dict[str, list[ForcedChoiceSet]],
                 ks: list[int], coco: bool = True, unit: str = "image"
                 ) -> tuple[dict[Key, MetricScores], dict[Key, list[float]]]:
    """Every MAGIC-split score of one model, keyed by (benchmark, labels, direction, metric, level).

    `unit`: what the bootstrap resamples for image-level queries, the test image or its l1 group.
    """
    rows = np.array([emb.image_index[i] for i in items.image_ids])
    images = emb.images[rows]
    out: dict[Key, MetricScores] = {}
    per_seed: dict[Key, list[float]] = {}
    group_ids = np.unique(np.asarray(items.groups), return_inverse=True)[1]
    image_units = group_ids if unit == "group" else np.arange(len(items.image_ids))
    for f in items.fields:
        sets = fc_sets[f.name]
        t2i, i2t = zip(*(score_forced_choice(s, images, emb.text_vectors, emb.text_index) for s in sets))
        chance = 1.0 / sets[0].choices
        for direction, correct in (("t2i", t2i), ("i2t", i2t)):
            key = ("forced_choice", f.labels, direction, "accuracy", f.key)
            out[key] = MetricScores(pooled_scores(sets, list(correct), image_units), chance)
            per_seed[key] = [float(c.mean()) if c.size else float("nan") for c in correct]
        if f.key == "caption" and not coco:
            continue
        benchmark, labels = ("coco", CAPTIONS) if f.key == "caption" else ("gallery", f.labels)
        for (direction, metric), ms in gallery_scores(f, images, emb.text_vectors, emb.text_index, ks,
                                                      group_ids, image_units).items():
            out[(benchmark, labels, direction, metric, f.key)] = ms
    return out, per_seed


def _score_hierarcaps(hc_items: list, emb: Embeddings, params) -> tuple[dict[Key, MetricScores], dict]:
    """Every HierarCaps score of one model, and the hierarchy metric's exclusions."""
    p = params.eval
    rows = np.array([emb.image_index[item.image_id] for item in hc_items])
    images = emb.images[rows]
    out: dict[Key, MetricScores] = {}
    for level in range(1, len(hc_items[0].levels) + 1):
        texts = [item.levels[level - 1] for item in hc_items]
        for (direction, metric), ms in level_retrieval(texts, images, emb.text_vectors, emb.text_index,
                                                       p.recall_at).items():
            out[("hierarcaps", "hierarcaps", direction, metric, f"l{level}")] = ms
        for (direction, metric), ms in in_batch_accuracy(texts, images, emb.text_vectors, emb.text_index,
                                                         p.hierarcaps_batch, p.seeds).items():
            out[("hierarcaps_batch", "hierarcaps", direction, metric, f"l{level}")] = ms
    root = emb.text([ROOT_TEXT])[0]
    h = hierarchical_metric(hc_items, images, emb.text_vectors, emb.text_index, root, radii=p.hierarcaps_radii)
    nan = float("nan")
    out[("hierarcaps_hierarchy", "hierarcaps", "i2t", "precision", "all")] = MetricScores(h.precision, nan)
    out[("hierarcaps_hierarchy", "hierarcaps", "i2t", "recall", "all")] = MetricScores(h.recall, nan)
    out[("hierarcaps_hierarchy", "hierarcaps", "-", "kendall_tau", "all")] = MetricScores(h.kendall_tau, 0.0)
    return out, {"kendall_tau_undefined": h.n_tau_undefined}


# ------------------------------------------------------------------------------------------- summary
def _paired_seeds(scores: dict[str, Scores]) -> dict[str, Scores]:
    """Every model with the training seeds of the most seeded one: a frozen (zoo) model's one row repeated, so
    differences pair seed k with seed k."""
    n_seeds = max((s.n_seeds for s in scores.values()), default=1)
    return {n: repeat_seeds(s, n_seeds) for n, s in scores.items()}


def seed_values(scores: dict[Key, dict[str, MetricScores]], train_seeds: list[int], frozen: set[str]) -> pd.DataFrame:
    """seeds.csv: each model's value under each training seed, per metric row (a frozen model: one row, seed -)."""
    rows = []
    for (benchmark, labels, direction, metric, level), by_model in scores.items():
        for name, ms in by_model.items():
            values = ms.scores.seed_means()
            for k, value in zip(["-"] if name in frozen else train_seeds, values):
                rows.append({"model": name, "training_seed": k, "benchmark": benchmark, "labels": labels,
                             "direction": direction, "metric": metric, "level": level, "value": float(value)})
    return pd.DataFrame(rows, columns=report.SEED_COLUMNS)


def summarize(scores: dict[Key, dict[str, MetricScores]], models: list[dict], resamples: int, ci: float,
              seed: int, excluded: dict[Key, int | dict[str, int]], exposure: dict[str, str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Bootstrap every key's scores for all models at once; tidy metrics and paired differences.

    A model's value is its mean over training seeds (n_seeds, seed_sd: the SD of its per-seed values); a
    difference's p-value is Holm-adjusted over the differences of its metric row (every pair of models).
    """
    names = [m["name"] for m in models]
    exposed = {m["name"]: m["exposed_to_eval_strings"] for m in models}
    pairs = [(names[j], names[i]) for i in range(len(names)) for j in range(i + 1, len(names))]
    metric_rows, diff_rows = [], []
    for key, by_model in scores.items():
        benchmark, labels, direction, metric, level = key
        present = [n for n in names if n in by_model]
        intervals, diffs = _intervals(key, _paired_seeds({n: by_model[n].scores for n in present}),
                                      [(a, b) for a, b in pairs if a in by_model and b in by_model],
                                      resamples, ci, seed)
        for n in present:
            iv = intervals[n]
            n_excluded = excluded.get(key, 0)
            n_excluded = n_excluded.get(n, 0) if isinstance(n_excluded, dict) else n_excluded
            per_seed = by_model[n].scores.seed_means()
            metric_rows.append({
                "model": n, "benchmark": benchmark, "labels": labels, "direction": direction, "metric": metric,
                "level": level, "value": iv.value, "ci_low": iv.low, "ci_high": iv.high, "n": iv.n_units,
                "n_queries": iv.n_queries, "n_excluded": n_excluded, "n_seeds": by_model[n].scores.n_seeds,
                "seed_sd": float(np.std(per_seed, ddof=1)) if per_seed.size > 1 else float("nan"),
                "chance": by_model[n].chance,
                "exposed_to_eval_strings": exposed[n], "exposure": _exposure_note(n, benchmark, exposure)})
        for (a, b), iv in diffs.items():
            diff_rows.append({"model_a": a, "model_b": b, "benchmark": benchmark, "labels": labels,
                              "direction": direction, "metric": metric, "level": level, "difference": iv.value,
                              "ci_low": iv.low, "ci_high": iv.high, "n": iv.n_units, "n_seeds": iv.n_seeds,
                              "significant": iv.significant, "p_value": iv.p_value})
    differences = pd.DataFrame(diff_rows, columns=report.DIFF_COLUMNS)
    # the family of a difference: every pair and level of its benchmark, labels, direction and metric
    family = ["benchmark", "labels", "direction", "metric"]
    differences["p_holm"] = (differences.groupby(family, sort=False)["p_value"].transform(lambda p: holm(p.to_numpy()))
                             if len(differences) else pd.Series(dtype=float))
    differences["significant_holm"] = differences["p_holm"].le(1 - ci)
    return pd.DataFrame(metric_rows, columns=report.METRIC_COLUMNS), differences


def _intervals(key: Key, scores: dict[str, Scores], pairs: list[tuple[str, str]], resamples: int, ci: float,
               seed: int) -> tuple[dict, dict]:
    """Intervals and paired differences; when models kept different items (Kendall tau: chains whose distances
    all tie are undefined, and that depends on the model) each model gets its own interval and differences use
    the items all models share (one query per item there)."""
    stream = ""  # one set of resamples per number of units, shared by every metric (see resample_weights)
    units = [s.units for s in scores.values()]
    if all(u.shape == units[0].shape and np.array_equal(u, units[0]) for u in units):
        return intervals_and_differences(scores, pairs, resamples, ci, seed, stream)
    if any(np.unique(s.units).size != s.units.size for s in scores.values()):
        raise ValueError(f"{key}: models were scored on different items; score every model on the same items")
    intervals = {n: intervals_and_differences({n: s}, [], resamples, ci, seed, stream)[0][n]
                 for n, s in scores.items()}
    common = np.array(sorted(set.intersection(*(set(s.units.tolist()) for s in scores.values()))), dtype=np.int64)
    shared = {n: Scores(_at_units(s, common), common) for n, s in scores.items()}
    return intervals, intervals_and_differences(shared, pairs, resamples, ci, seed, stream)[1]


def _at_units(scores: Scores, units: np.ndarray) -> np.ndarray:
    """Values of the queries of `units` (one query per unit), in the order of `units` (per training seed: the
    last axis)."""
    position = {int(u): i for i, u in enumerate(scores.units)}
    return scores.values[..., [position[int(u)] for u in units]]


def leakage_note(magic) -> str:
    """The exposure of models trained on generalized captions: the share of training captions that contain their
    image's (or node's) concept name at each level (magic stats 'leakage'), or '' when none does."""
    train = (magic.stats.get("leakage") or leakage(magic))["train"]
    levels = train["by_level"]
    if not train["captions"] or not any(v["captions"] for v in levels.values()):
        return ""
    shares = ", ".join(f"{k} {100 * v['share']:.1f}%" for k, v in levels.items())
    return f"its generalized training captions contain their concept names ({shares} of {train['captions']})"


def _exposure_note(model: str, benchmark: str, exposure: dict[str, str]) -> str:
    notes = [exposure.get(f"{model}|*", "")]
    if benchmark.startswith("hierarcaps"):
        notes.append(exposure.get(f"{model}|hierarcaps", ""))
    return "; ".join(n for n in notes if n)


# -------------------------------------------------------------------------------------------- entry
def model_fingerprints(run: RunContext, name: str, seed: int = 0) -> tuple[str, str] | None:
    """Tower hashes from the weights file training wrote under training seed `seed` (no model build on a cache
    hit), None when absent.

    The architecture and preprocessing part of the key is `params.model` (what `load_trained` builds from).
    """
    from cglib.train.loop import INITIAL

    path = training_dir(run.dir, seed) / (INITIAL if name == ZERO_SHOT else f"{name}/final.safetensors")
    if not path.is_file():
        return None
    arch = run.params.model.model_dump(mode="json", exclude={"pretrained", "checkpoint"})
    return file_fingerprints(path, "model:" + json.dumps(arch, sort_keys=True))


def zoo_fingerprints(bundle: ClipModel, spec: ModelParams) -> tuple[str, str]:
    """Tower hashes of a loaded zoo model (it has no weights file of this run) joined with its spec, so a changed
    spec (activation, image size, tag) recomputes and the same spec and weights reuse the cache."""
    key = json.dumps(spec.model_dump(mode="json"), sort_keys=True)
    image, text = tower_fingerprints(bundle)
    return (hashlib.sha1(f"{image}|zoo:{key}".encode()).hexdigest(),
            hashlib.sha1(f"{text}|zoo:{key}".encode()).hexdigest())


def _zoo_loader(spec: ModelParams, device: str, seed: int) -> Callable[[str], ClipModel]:
    """Builds a zoo model in eval mode; what it leaves at random init (no tag, no checkpoint) is seeded (run.seed),
    so such a reference is the same model on every rerun (and its cached embeddings are reused)."""
    import torch

    from cglib.models import build_model

    def load(_name: str) -> ClipModel:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            bundle = build_model(spec, device)
        bundle.model.eval()
        return bundle

    return load


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


class _LazyModel:
    """Loads a model on first call (both item sets share it) and releases it before the next model."""

    def __init__(self, load: Callable[[str], ClipModel], name: str, device: str) -> None:
        self.load, self.name, self.device = load, name, device
        self.bundle: ClipModel | None = None

    def __call__(self) -> ClipModel:
        if self.bundle is None:
            self.bundle = self.load(self.name)
            self.bundle.model.to(self.device)
        return self.bundle

    def image_size(self) -> int:
        """The model's input size (loads the model)."""
        return self().image_size

    def release(self) -> None:
        self.bundle = None


def evaluate_run(run: RunContext, progress: bool = True,
                 loader: Callable[[str], ClipModel] | None = None) -> EvalResults:
    """Evaluate the zero-shot model, every trained run and every `eval.zoo` model on identical items; write and
    return all results.

    `loader(name) -> ClipModel` loads a trained model by name (default: `cglib.train.load_trained`); zoo models
    are built from their spec (`cglib.models.build_model`), and one that cannot be loaded is skipped.
    """
    return _evaluate(run, _model_info(run), run.stage("evaluation"), progress, loader)


def default_model_name(spec: ModelParams) -> str:
    """A row name for a model spec: the checkpoint's stem, else the name and the pretrained tag."""
    raw = Path(spec.checkpoint).stem if spec.checkpoint else "-".join(p for p in (spec.name, spec.pretrained) if p)
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip("-.") or "model"


def evaluate_model(run: RunContext, spec: ModelParams, name: str | None = None, progress: bool = True,
                   loader: Callable[[str], ClipModel] | None = None) -> EvalResults:
    """Score one more model (a `model` section: open_clip name + tag, a cglib config, a checkpoint) on a run's
    MAGIC items, next to the run's zero-shot model, without training anything.

    Writes the evaluation files under `<run>/evaluation/models/<name>/`. Raises ModelLoadError when the model's
    weights cannot be loaded, ValueError for a bad name. `loader` loads the zero-shot model (tests).
    """
    name = name or default_model_name(spec)
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name in (ZERO_SHOT, ".", ".."):
        raise ValueError(f"model name {name!r}: use letters, digits, '_', '.', '-' and not '{ZERO_SHOT}' "
                         "(pass --name)")
    out_dir = run.stage("evaluation") / MODELS_DIR / name
    fresh = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        return _evaluate(run, [_zero_shot_info(), zoo_info(name, spec)], out_dir, progress, loader, strict_zoo=True)
    except ModelLoadError:
        if fresh:  # leave no empty results folder behind
            import shutil

            shutil.rmtree(out_dir, ignore_errors=True)
        raise


def _evaluate(run: RunContext, models: list[dict], out_dir: Path, progress: bool,
              loader: Callable[[str], ClipModel] | None, strict_zoo: bool = False) -> EvalResults:
    """Score `models` (results.json `models` entries; zoo ones carry their spec) on identical items, write to
    `out_dir`. A zoo model that cannot be loaded is skipped (`strict_zoo`: ModelLoadError)."""
    start = time.perf_counter()
    params = run.params
    p = params.eval
    set_faiss_threads(params.run.threads)
    magic = load_magic(run.require("magic/magic.json", "03_magic_dag"))
    dataset = CaptionDataset.load(run.require("captions/dataset.json", "01_captions").parent)
    ground_truth = load_ground_truth(run.dir / "captions")
    load = loader or _default_loader(run)
    device = run.device()
    train_seeds = list(params.train.seeds)
    specs = {m["name"]: ModelParams.model_validate(m["spec"]) for m in models if m.get("zoo")}
    # one model per (name, training seed): a zoo model is frozen and has one
    lazy = {(m["name"], k): _LazyModel(_zoo_loader(specs[m["name"]], device, params.run.seed) if m.get("zoo")
                                       else _seed_loader(load, k), m["name"], device)
            for m in models for k in ([train_seeds[0]] if m.get("zoo") else train_seeds)}
    image_size = lazy[(ZERO_SHOT, train_seeds[0])].image_size
    pixels_fn, image_source, readable, skipped = _test_pixels(run, magic, dataset, image_size, progress)
    items = build_items(magic, readable, ground_truth, include_fallback=p.fallback_negatives,
                        include_generalized_fallback=p.include_generalized_fallback)
    skipped.update(items.skipped)

    # Forced-choice items: sampled once per seed, shared by every model.
    fc_sets = {f.name: [sample_forced_choice(items, f, p.choices, seed, p.negative_source) for seed in p.seeds]
               for f in items.fields}
    excluded: dict[Key, int | dict[str, int]] = {}
    for f in items.fields:
        n_out = sum(sum(s.excluded.values()) for s in fc_sets[f.name])  # (seed, item) queries left out
        for direction in ("t2i", "i2t"):
            excluded[("forced_choice", f.labels, direction, "accuracy", f.key)] = n_out

    hc = _load_hierarcaps(run, magic, image_size, progress) if p.hierarcaps else None
    # eval.clustering: category discovery (clustering.py); which test concepts have training images, per level
    seen = seen_concepts(magic, ground_truth, items.levels) if p.clustering else None
    clustering_info: dict[str, dict] = {}
    kp = None  # eval.keyword_permutation: each image's caption vs the caption with one keyword swapped
    if p.keyword_permutation:
        from cglib.related.keyword_eval import permutation_items
        from cglib.related.permute import permuter_for

        kp = permutation_items(items.field("caption").texts, permuter_for(params), p.seeds)
        for kind in kp.counts:
            excluded[kp.key(kind)] = kp.excluded(kind)
    magic_texts = items.all_texts() if kp is None else sorted(set(items.all_texts()) | set(kp.texts()))
    # why a model saw evaluation strings, as its training summary says (older summaries: textual pretraining)
    exposure = {f"{m['name']}|*": "; ".join(m.get("exposure") or
                                            ["trained with the l1-l4 concept names (textual pretraining)"])
                for m in models if m["exposed_to_eval_strings"]}
    trained = [m for m in models[1:] if not m.get("zoo")]
    leak_note = leakage_note(magic)
    for m in trained:
        # generalized captions are trained on by MAGIC fine-tuning (text_source: generalized) and by textual
        # pretraining; an re run trains on concept chains and original captions only
        on_generalized = (m.get("objective") != "re" and m.get("text_source", params.train.text_source) == "generalized"
                          or m["pretrain"] != "none")
        if leak_note and on_generalized:
            exposure[f"{m['name']}|*"] = "; ".join(n for n in (exposure.get(f"{m['name']}|*"), leak_note) if n)
    if hc is not None and hc["include_train"] and hc["overlap"]["train"]:
        for m in trained:
            exposure[f"{m['name']}|hierarcaps"] = (f"trained on {hc['overlap']['train']} of the {len(hc['items'])} "
                                                   "HierarCaps images (in this run's MAGIC train split)")
    own_store = EmbeddingStore(out_dir / "embeddings", batch_size=p.batch_size)
    run_embeddings = run.dir / "evaluation" / "embeddings"
    run_store = (own_store if run_embeddings == own_store.directory
                 else EmbeddingStore(run_embeddings, batch_size=p.batch_size))
    # Inputs at each input size: the main model's, and a zoo model's own (file datasets: the image cache at it).
    magic_inputs: dict[int, tuple[Callable[[], np.ndarray], str, set[str]]] = {}
    hc_inputs: dict[int, dict] = {}
    by_seed: dict[Key, dict[str, list[MetricScores]]] = {}  # each model's scores under each training seed
    per_seed: dict[str, dict[str, list[float]]] = {}
    hc_info: dict[str, dict] = {}
    zoo_skipped: dict[str, str] = {}
    for (name, k), bundle in tqdm(lazy.items(), desc="evaluate models", disable=not progress):
        info = next(m for m in models if m["name"] == name)
        label = seed_label(name, k)  # its embedding cache and per-seed entries: NAME, or NAME@seed<k>
        store = run_store if name == ZERO_SHOT else own_store
        if info.get("zoo"):
            try:
                fingerprints = zoo_fingerprints(bundle(), specs[name])
                size = bundle.image_size()
                magic_pix, hc_pix = _inputs_at(size, image_size(), run, magic, dataset, items.image_ids, hc, progress,
                                               (pixels_fn, image_source), magic_inputs, hc_inputs)
            except Exception as exc:  # a download offline, a missing checkpoint, an unknown architecture
                bundle.release()
                reason = _reason(exc)
                if strict_zoo:
                    raise ModelLoadError(f"model {name!r} could not be loaded: {reason}") from exc
                logger.warning("eval.zoo model %r skipped, not scored: %s", name, reason)
                zoo_skipped[name] = reason
                continue
        else:
            fingerprints = model_fingerprints(run, name, k) if loader is None else None
            magic_pix, hc_pix = (pixels_fn, image_source), hc
        emb = store.embed(label, "magic", bundle, items.image_ids, magic_pix[1], magic_pix[0], magic_texts,
                          fingerprints)
        model_scores, seeds_values = _score_magic(items, emb, fc_sets, p.recall_at, p.coco_retrieval,
                                                  p.bootstrap_unit)
        test_images = emb.images[np.array([emb.image_index[i] for i in items.image_ids])]
        if seen is not None:
            cluster_scores, clustering_info[label] = clustering_scores(items, test_images, seen, p.seeds,
                                                                       p.bootstrap_unit)
            model_scores.update(cluster_scores)
        if kp is not None:
            from cglib.related.keyword_eval import permutation_scores

            group_ids = np.unique(np.asarray(items.groups), return_inverse=True)[1]
            units = group_ids if p.bootstrap_unit == "group" else np.arange(len(items.image_ids))
            model_scores.update(permutation_scores(kp, test_images, emb.text_vectors, emb.text_index, units))
        if hc is not None:
            emb_hc = store.embed(label, "hierarcaps", bundle, hc["ids"], hc_pix["source"], hc_pix["pixels"],
                                 hc["texts"], fingerprints)
            hc_scores, hc_info[label] = _score_hierarcaps(hc["items"], emb_hc, params)
            model_scores.update(hc_scores)
        for key, ms in model_scores.items():
            by_seed.setdefault(key, {}).setdefault(name, []).append(ms)
        for key, values in seeds_values.items():
            per_seed.setdefault("|".join(key), {})[label] = values
        bundle.release()
    scores = {key: {name: MetricScores(stack_seeds([ms.scores for ms in seeds]), float(np.mean(
        [ms.chance for ms in seeds]))) for name, seeds in v.items()} for key, v in by_seed.items()}
    models = [m for m in models if m["name"] not in zoo_skipped]
    for m in models:
        m["n_seeds"] = 1 if m.get("zoo") else len(train_seeds)
        m["training_seeds"] = [] if m.get("zoo") else train_seeds
    if hc is not None:
        tau_key = ("hierarcaps_hierarchy", "hierarcaps", "-", "kendall_tau", "all")
        excluded[tau_key] = {name: v["kendall_tau_undefined"] for name, v in hc_info.items()}

    metrics, differences = summarize(scores, models, p.bootstrap, p.ci, params.run.seed, excluded, exposure)
    seeds_table = seed_values(scores, train_seeds, {m["name"] for m in models if m.get("zoo")})
    table = report.table3(metrics)
    info = {
        "protocol": PROTOCOL,
        "settings": {"choices": p.choices, "seeds": p.seeds, "training_seeds": train_seeds,
                     "n_seeds": len(train_seeds), "bootstrap": p.bootstrap, "ci": p.ci,
                     "recall_at": p.recall_at, "hierarcaps_batch": p.hierarcaps_batch,
                     "hierarcaps_radii": p.hierarcaps_radii, "fallback_negatives": p.fallback_negatives,
                     "negative_source": p.negative_source, "bootstrap_unit": p.bootstrap_unit,
                     "bootstrap_seed": params.run.seed,
                     **({"keyword_permutation": True} if p.keyword_permutation else {})},
        "models": models,
        "zoo_skipped": zoo_skipped,
        "items": {
            "n_test_images": len(items.image_ids), "n_groups": len(set(items.groups)),
            "skipped_images": dict(skipped), "ground_truth": items.has_ground_truth,
            "without_text": {f.name: f.n_without_text() for f in items.fields},
            "text_exclusions": items.text_exclusions,
            "generalized_leakage": (magic.stats.get("leakage") or leakage(magic))["train"],
            "forced_choice_excluded": {name: {str(s.seed): dict(s.excluded) for s in sets}
                                       for name, sets in fc_sets.items()},
            "forced_choice_items": {name: sets[0].anchors.size for name, sets in fc_sets.items()},
            **({} if kp is None else {"keyword_permutation": {"relations": kp.relations, "per_type": kp.counts}}),
        },
        "hierarcaps": None if hc is None else {
            "n_items": len(hc["items"]), "skipped": hc["skipped"], "overlap_with_run_images": hc["overlap"],
            "include_train": hc["include_train"], "left_out_train": hc["left_out_train"],
            "per_model": hc_info},
        "per_seed": per_seed,
        "clustering": None if seen is None else {
            "protocol": "k-means (faiss, one run per eval.seeds) of the test images' embeddings per level, k = the "
                        "level's concepts among the test images; clustering accuracy under the Hungarian matching "
                        "on all images, split into seen and held-out concepts; CIs are conditional on the matching "
                        "(cglib/evaluate/clustering.py)",
            "per_model": clustering_info},
        "embeddings_computed": {**run_store.computed, **own_store.computed},
    }
    info["reading"] = report.read_results(metrics, differences, EvalResults(
        metrics, differences, table, info, out_dir).comparisons())
    gains, gain_notes = report.gain_rows(metrics, {k: _paired_seeds({n: ms.scores for n, ms in v.items()})
                                                   for k, v in scores.items()},
                                         report.model_roles(models), p.bootstrap, p.ci, params.run.seed)
    info["gains"] = {"notes": gain_notes}
    info["seconds"] = round(time.perf_counter() - start, 2)
    paths = _write(out_dir, run, metrics, differences, table, info, scores, gains, seeds_table)
    return EvalResults(metrics=metrics, differences=differences, table3=table, info=info, directory=out_dir,
                       paths=paths, gains=gains, seeds=seeds_table)


def _inputs_at(size: int, main: int, run: RunContext, magic, dataset: CaptionDataset, image_ids: list[str],
               hc: dict | None, progress: bool, main_pixels: tuple[Callable[[], np.ndarray], str],
               magic_cache: dict, hc_cache: dict) -> tuple[tuple[Callable[[], np.ndarray], str], dict | None]:
    """A zoo model's test pixels (and HierarCaps pixels) at its own input size, on the same items.

    In-memory pixels are resized by the model (`pixels_to_tensor`); image files come from the run's image cache
    at that size (built once, reused). An item unreadable at that size is an error (the items must not change).
    """
    if size == main or dataset.pixels is not None:
        magic_pix = main_pixels
    else:
        if size not in magic_cache:
            fn, source, readable, _ = _test_pixels(run, magic, dataset, lambda: size, progress)
            missing = [i for i in image_ids if i not in readable]
            if missing:
                raise ValueError(f"{len(missing)} test images cannot be read at {size} px (first: {missing[0]})")
            magic_cache[size] = (fn, source)
        magic_pix = magic_cache[size]
    if hc is None or size == main:
        return magic_pix, hc
    if size not in hc_cache:
        other = _load_hierarcaps(run, magic, lambda: size, progress)
        if other["ids"] != hc["ids"]:
            raise ValueError(f"the HierarCaps images readable at {size} px differ from those at {main} px")
        hc_cache[size] = other
    return magic_pix, hc_cache[size]


def _load_hierarcaps(run: RunContext, magic, image_size: Callable[[], int], progress: bool) -> dict:
    """HierarCaps items, lazy pixels (image cache), their fingerprint, texts (+ the root's empty string)."""
    from cglib.data.hierarcaps import load_hierarcaps
    from cglib.data.image_cache import build_image_cache

    d = run.params.data
    if d.hierarcaps_csv is None or d.hierarcaps_images is None:
        raise ValueError("eval.hierarcaps is true but data.hierarcaps_csv / data.hierarcaps_images are not set; "
                         "set both (see params/hierarcaps.yaml) or set eval.hierarcaps: false")
    hc = load_hierarcaps(d.hierarcaps_csv, d.hierarcaps_images)
    if not hc.items:
        raise ValueError(f"no usable HierarCaps item in {d.hierarcaps_csv} (skipped: {dict(hc.skipped)})")
    dataset = CaptionDataset(source="hierarcaps", image_ids=[i.image_id for i in hc.items],
                             captions={i.image_id: [i.levels[-1]] for i in hc.items},
                             image_files={i.image_id: i.image_file for i in hc.items})
    cache = build_image_cache(dataset, image_size(), run.dir / "cache" / "images", progress=progress)
    skipped = Counter(hc.skipped)
    skipped.update(cache.skipped)
    items = [i for i in hc.items if i.image_id in cache]
    ids = [i.image_id for i in items]
    # The same COCO photo may be in the run's own data (keyed by COCO id or by file stem).
    def in_run(item, split: str | None) -> bool:
        for key in (item.image_id, str(item.coco_id)):
            record = magic.images.get(key)
            if record is not None and (split is None or record.split == split):
                return True
        return False

    overlap = {"any": sum(in_run(i, None) for i in items), "train": sum(in_run(i, "train") for i in items)}
    include_train = run.params.eval.hierarcaps_include_train
    if not include_train:  # HierarCaps is unseen data: items the trained models saw are left out, and counted
        items = [i for i in items if not in_run(i, "train")]
        if not items:
            raise ValueError(f"all {overlap['train']} readable HierarCaps images are in this run's MAGIC train split, "
                             "so none is unseen; raise magic.test_fraction, or set eval.hierarcaps_include_train: "
                             "true to score seen images")
        ids = [i.image_id for i in items]
    texts = sorted({t for i in items for t in i.levels} | {ROOT_TEXT})
    return {"items": items, "ids": ids, "pixels": lambda: cache.get(ids), "texts": texts,
            "source": pixel_fingerprint(files=[i.image_file for i in items]), "skipped": dict(skipped),
            "overlap": overlap, "include_train": include_train,
            "left_out_train": 0 if include_train else overlap["train"]}


def _write(out_dir: Path, run: RunContext, metrics: pd.DataFrame, differences: pd.DataFrame, table: pd.DataFrame,
           info: dict, scores: dict[Key, dict[str, MetricScores]], gains: pd.DataFrame,
           seeds_table: pd.DataFrame) -> dict[str, Path]:
    paths = {"metrics": out_dir / METRICS_FILE, "differences": out_dir / DIFFERENCES_FILE,
             "seeds": out_dir / SEEDS_FILE,
             "table3_csv": out_dir / "table3.csv", "table3_md": out_dir / "table3.md",
             "gains": out_dir / GAINS_FILE, "scores": out_dir / SCORES_FILE, "results": out_dir / RESULTS_FILE}
    metrics.to_csv(paths["metrics"], index=False)
    seeds_table.to_csv(paths["seeds"], index=False)
    differences.to_csv(paths["differences"], index=False)
    table.to_csv(paths["table3_csv"])
    gains.to_csv(paths["gains"], index=False)
    paths["table3_md"].write_text(report.table3_markdown(
        table, report.table3_notes(info), gains, info["gains"]["notes"], report.table3_protocols(table, info),
        report.zero_shot_section(differences, metrics, info["settings"].get("ci", 0.95))), encoding="utf-8")
    arrays = {}
    for key, by_model in scores.items():
        for model, ms in by_model.items():
            arrays[f"{'|'.join(key)}|{model}|values"] = ms.scores.values
            arrays[f"{'|'.join(key)}|{model}|units"] = ms.scores.units
    np.savez_compressed(paths["scores"], **arrays)
    record = {**info, "provenance": provenance(run.params, stage="evaluation"),
              "metrics": metrics.to_dict(orient="records"), "differences": differences.to_dict(orient="records")}
    write_json(paths["results"], record)
    return paths


def load_results(run_dir: str | Path) -> EvalResults:
    """Read the files `evaluate_run` wrote under `<run_dir>/evaluation/`."""
    directory = Path(run_dir) / "evaluation"
    path = directory / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run notebook 06_evaluation (cglib.evaluate.evaluate_run) first")
    info = json.loads(path.read_text(encoding="utf-8"))
    info.pop("metrics", None)
    info.pop("differences", None)
    metrics = pd.read_csv(directory / METRICS_FILE, dtype={"exposure": str, "level": str})
    for column, default in (("n_seeds", 1), ("seed_sd", float("nan"))):  # files written before train.seeds
        if column not in metrics.columns:
            metrics.insert(report.METRIC_COLUMNS.index(column), column, default)
    metrics["exposure"] = metrics["exposure"].fillna("")
    differences = pd.read_csv(directory / DIFFERENCES_FILE)
    table = pd.read_csv(directory / "table3.csv", index_col="model")
    gains_path = directory / GAINS_FILE  # absent in evaluations written before the gain rows
    gains = (pd.read_csv(gains_path, dtype={"level": str, "models_a": str, "models_b": str}) if gains_path.is_file()
             else pd.DataFrame(columns=report.GAIN_COLUMNS))
    seeds = (pd.read_csv(directory / SEEDS_FILE, dtype={"level": str, "training_seed": str})
             if (directory / SEEDS_FILE).is_file() else pd.DataFrame(columns=report.SEED_COLUMNS))
    return EvalResults(metrics=metrics, differences=differences, table3=table, info=info, directory=directory,
                       paths={p.stem: p for p in directory.iterdir() if p.is_file()}, gains=gains, seeds=seeds)


def load_scores(run_dir: str | Path) -> dict[tuple[str, ...], dict[str, Scores]]:
    """The per-query scores behind every metric: {(benchmark, labels, direction, metric, level): {model: Scores}}."""
    out: dict[tuple[str, ...], dict[str, Scores]] = {}
    with np.load(Path(run_dir) / "evaluation" / SCORES_FILE) as f:
        for name in f.files:
            if not name.endswith("|values"):
                continue
            *key, model, _ = name.split("|")
            out.setdefault(tuple(key), {})[model] = Scores(f[name], f[name[: -len("values")] + "units"])
    return out

