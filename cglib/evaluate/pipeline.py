"""`evaluate_run`: every model of a run on identical items, every benchmark, with CIs; writes all result files.

Benchmarks are plug-ins (cglib/evaluate/benchmarks/): the built-in ones (forced choice, gallery, COCO captions,
clustering, keyword permutation, HierarCaps) and a run's own (`eval.benchmarks`), each prepared once and scored on
every model; this module loads the models and the MAGIC test images, loops over models and benchmarks, and
summarizes (summary.py), writes (results.py), tabulates (table3.py, gains.py) and reads (reading.py).

Files under `<run>/evaluation/`:

    results.json     protocol, models (roles and exposure flags), item counts and exclusions, per-seed values,
                     every metric and paired difference, the automatic reading, the gain rows' notes, provenance
    metrics.csv      one row per model x benchmark x labels x direction x metric x level: value (the mean over
                     training seeds), CI, n, n_seeds, seed_sd (SD of the per-seed values), chance
    seeds.csv        the value of every (model, training seed) per metric row (Fig. 4's thin lines, seed_sd)
    differences.csv  paired differences between every two models on the same items, with paired CIs, p-values
                     and Holm-adjusted p-values (the family: every difference of that metric row)
    table3.csv/.md   Table 3 regenerated (percent, 95% CIs); the .md also has our gain rows under it (gains.csv)
    table3_as_published.csv/.md   the same models scored with the authors' evaluation protocol, the paper's rows
                     under them, the gain rows by the paper's rule beside the paper's printed ones
                     (evaluate/paper.py), and what the evaluation corrections change
    protocol_changes.csv   per column: corrected minus as published, paired CI (evaluate/protocols.py)
    gains.csv        our "Avg Accuracy Gain w.r.t." rows per Table 3 column (our definition, evaluate/gains.py:
                     points, relative %, paired CIs)
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

import json
import logging
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cglib.config import ModelParams
from cglib.data.dataset import CaptionDataset, load_ground_truth
from cglib.data.image_cache import magic_image_cache
from cglib.evaluate.benchmarks import Benchmark, EvalContext, ImageSet, Key, Scored, benchmarks_for
from cglib.evaluate.bootstrap import stack_seeds
from cglib.evaluate.embeddings import EmbeddingStore, pixel_fingerprint
from cglib.evaluate.gains import gain_rows, model_roles
from cglib.evaluate.gallery import MetricScores
from cglib.evaluate.items import build_items
from cglib.evaluate.loading import (
    ZERO_SHOT,
    LazyModel,
    ModelLoadError,
    default_loader,
    default_model_name,
    model_fingerprints,
    reason,
    seed_loader,
    zero_shot_info,
    zoo_fingerprints,
    zoo_info,
    zoo_loader,
)
from cglib.evaluate.protocols import protocol_changes
from cglib.evaluate.reading import read_results
from cglib.evaluate.results import BASE_DIR, MODELS_DIR, EvalResults, write_results
from cglib.evaluate.retrieval import set_faiss_threads
from cglib.evaluate.summary import UNCERTAINTY_PROTOCOL, paired_seeds, seed_values, summarize
from cglib.evaluate.table3 import table3
from cglib.frontend import tqdm  # tqdm.auto live, a text bar left at its final count headless
from cglib.magic.files import load_magic
from cglib.magic.stats import leakage
from cglib.models import ClipModel
from cglib.run import RunContext, seed_label, training_dir
from cglib.train.inputs import related_methods

logger = logging.getLogger(__name__)


def _model_info(run: RunContext) -> list[dict]:
    """The zero-shot model and every trained run, with what their training saw and their role in the gain rows
    (`gains.ModelRole`: fine_tuned_on_magic, objective, pretrain, init), from each run's training summary.json
    of the first training seed (roles do not depend on the seed; the params' values where the summary does not
    say), then the zoo models (`eval.zoo`)."""
    infos = [zero_shot_info()]
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
    cache = magic_image_cache(run, magic.images, dataset, image_size(), progress)
    readable = [i for i in present if i in cache]
    for i in present:
        if i not in cache:
            skipped[cache.skipped_ids.get(i, "not in the image cache")] += 1
    fingerprint = pixel_fingerprint(files=[dataset.image_files[i] for i in readable])
    return (lambda: cache.get(readable)), fingerprint, set(readable), skipped


def leakage_note(magic) -> str:
    """The exposure of models trained on generalized captions: the share of training captions that contain their
    image's (or node's) concept name at each level (magic stats 'leakage'), or '' when none does."""
    train = (magic.stats.get("leakage") or leakage(magic))["train"]
    levels = train["by_level"]
    if not train["captions"] or not any(v["captions"] for v in levels.values()):
        return ""
    shares = ", ".join(f"{k} {100 * v['share']:.1f}%" for k, v in levels.items())
    return f"its generalized training captions contain their concept names ({shares} of {train['captions']})"


def evaluate_run(run: RunContext, progress: bool = True,
                 loader: Callable[[str], ClipModel] | None = None) -> EvalResults:
    """Evaluate the zero-shot model, every trained run and every `eval.zoo` model on identical items; write and
    return all results.

    `loader(name) -> ClipModel` loads a trained model by name (default: `cglib.train.load_trained`); zoo models
    are built from their spec (`cglib.models.build_model`), and one that cannot be loaded is skipped.
    """
    return _evaluate(run, _model_info(run), run.stage("evaluation"), progress, loader)


def evaluate_base(run: RunContext, progress: bool = True) -> EvalResults:
    """The zero-shot model alone (the base every run starts from, under every training seed) on notebook 06's
    items, written to `evaluation/base/`: notebook 05's look at the base before anything is fine-tuned from it.
    Its embeddings go to the run's cache, so `evaluate_run` reads them instead of embedding the base again."""
    return _evaluate(run, [zero_shot_info()], run.stage("evaluation") / BASE_DIR, progress, None)


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
        return _evaluate(run, [zero_shot_info(), zoo_info(name, spec)], out_dir, progress, loader, strict_zoo=True)
    except ModelLoadError:
        if fresh:  # leave no empty results folder behind
            shutil.rmtree(out_dir, ignore_errors=True)
        raise


def _exposure(models: list[dict], magic, params) -> dict[str, str]:
    """Why each model saw evaluation strings, keyed 'MODEL|*' (every row of it): what its training summary says
    (`_model_info` read it; older summaries: textual pretraining), and the concept names in the generalized
    captions it trained on. A benchmark adds its own ('MODEL|BENCHMARK', `Benchmark.exposure`)."""
    exposure = {f"{m['name']}|*": "; ".join(m.get("exposure") or
                                            ["trained with the l1-l4 concept names (textual pretraining)"])
                for m in models if m["exposed_to_eval_strings"]}
    leak_note = leakage_note(magic)
    for m in _trained(models):
        # generalized captions are trained on by MAGIC fine-tuning (text_source: generalized) and by textual
        # pretraining; an re run (not fine-tuned on MAGIC) trains on concept chains and original captions only
        on_generalized = (m.get("fine_tuned_on_magic", True)
                          and m.get("text_source", params.train.text_source) == "generalized"
                          or m["pretrain"] != "none")
        if leak_note and on_generalized:
            exposure[f"{m['name']}|*"] = "; ".join(n for n in (exposure.get(f"{m['name']}|*"), leak_note) if n)
    return exposure


def _trained(models: list[dict]) -> list[dict]:
    """The models trained in this run (not the zero-shot model, not a zoo model)."""
    return [m for m in models[1:] if not m.get("zoo")]


def _merge_description(info: dict, entries: dict) -> None:
    """A benchmark's `describe` into results.json: 'items' and 'settings' merged, other entries set."""
    for key, value in entries.items():
        if key in ("items", "settings"):
            info[key].update(value)
        else:
            info[key] = value


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
    load = loader or default_loader(run)
    device = run.device()
    train_seeds = list(params.train.seeds)
    specs = {m["name"]: ModelParams.model_validate(m["spec"]) for m in models if m.get("zoo")}
    # one model per (name, training seed): a zoo model is frozen and has one
    lazy = {(m["name"], k): LazyModel(zoo_loader(specs[m["name"]], device, params.run.seed) if m.get("zoo")
                                      else seed_loader(load, k), m["name"], device)
            for m in models for k in ([train_seeds[0]] if m.get("zoo") else train_seeds)}
    image_size = lazy[(ZERO_SHOT, train_seeds[0])].image_size
    pixels_fn, image_source, readable, skipped = _test_pixels(run, magic, dataset, image_size, progress)
    items = build_items(magic, readable, ground_truth, include_fallback=p.fallback_negatives,
                        include_generalized_fallback=p.include_generalized_fallback)
    skipped.update(items.skipped)

    # Every benchmark's items: prepared once, shared by every model.
    context = EvalContext(run, magic, ground_truth, items, image_size, progress)
    known = benchmarks_for(params)
    active: list[tuple[Benchmark, object]] = [(b, b.prepare(context)) for b in known if b.enabled(params)]
    magic_texts = sorted({t for b, prepared in active for t in b.texts(prepared)})
    own_store = EmbeddingStore(out_dir / "embeddings", batch_size=p.batch_size)
    run_embeddings = run.dir / "evaluation" / "embeddings"
    run_store = (own_store if run_embeddings == own_store.directory
                 else EmbeddingStore(run_embeddings, batch_size=p.batch_size))
    magic_inputs: dict[int, tuple[Callable[[], np.ndarray], str]] = {}  # a zoo model's input size: its test pixels
    by_seed: dict[Key, dict[str, list[MetricScores]]] = {}  # each model's scores under each training seed
    per_seed: dict[str, dict[str, list[float]]] = {}
    per_model: dict[str, dict[str, dict]] = {b.name: {} for b, _ in active}  # each model label's Scored.info
    rows_of: dict[str, set[str]] = {b.name: set() for b, _ in active}  # the benchmark column of its rows
    zoo_skipped: dict[str, str] = {}
    for (name, k), bundle in tqdm(lazy.items(), desc="evaluate models", disable=not progress):
        label = seed_label(name, k)  # its embedding cache and per-seed entries: NAME, or NAME@seed<k>
        store = run_store if name == ZERO_SHOT else own_store
        if name in specs:  # a zoo model, at its own input size
            try:
                fingerprints = zoo_fingerprints(bundle(), specs[name])
                size = bundle.image_size()
                magic_pix = _magic_pixels_at(size, image_size(), run, magic, dataset, items.image_ids, progress,
                                             (pixels_fn, image_source), magic_inputs)
                own_images = {b.name: b.images(prepared, context, size) for b, prepared in active}
            except Exception as exc:  # a download offline, a missing checkpoint, an unknown architecture
                bundle.release()
                why = reason(exc)
                if strict_zoo:
                    raise ModelLoadError(f"model {name!r} could not be loaded: {why}") from exc
                logger.warning("eval.zoo model %r skipped, not scored: %s", name, why)
                zoo_skipped[name] = why
                continue
        else:
            fingerprints = model_fingerprints(run, name, k) if loader is None else None
            magic_pix = (pixels_fn, image_source)
            own_images = {b.name: b.images(prepared, context, None) for b, prepared in active}
        magic_emb = store.embed(label, "magic", bundle, items.image_ids, magic_pix[1], magic_pix[0], magic_texts,
                                fingerprints)
        for b, prepared in active:
            own: ImageSet | None = own_images[b.name]
            emb = magic_emb if own is None else store.embed(label, own.name, bundle, own.ids, own.source, own.pixels,
                                                            own.texts, fingerprints)
            scored: Scored = b.score(prepared, emb, context)
            for key, ms in scored.scores.items():
                by_seed.setdefault(key, {}).setdefault(name, []).append(ms)
                rows_of[b.name].add(key[0])
            for key, values in scored.per_seed.items():
                per_seed.setdefault("|".join(key), {})[label] = values
            per_model[b.name][label] = scored.info
        bundle.release()
    scores = {key: {name: MetricScores(stack_seeds([ms.scores for ms in seeds]), float(np.mean(
        [ms.chance for ms in seeds]))) for name, seeds in v.items()} for key, v in by_seed.items()}
    models = [m for m in models if m["name"] not in zoo_skipped]
    for m in models:
        m["n_seeds"] = 1 if m.get("zoo") else len(train_seeds)
        m["training_seeds"] = [] if m.get("zoo") else train_seeds
    excluded: dict[Key, int | dict[str, int]] = {}
    exposure = _exposure(models, magic, params)
    for b, prepared in active:
        excluded.update(b.excluded(prepared, per_model[b.name]))
        note = b.exposure(prepared)
        for m in _trained(models) if note else []:
            exposure.update({f"{m['name']}|{row}": note for row in rows_of[b.name]})

    metrics, differences = summarize(scores, models, p.bootstrap, p.ci, params.run.seed, excluded, exposure)
    seeds_table = seed_values(scores, train_seeds, {m["name"] for m in models if m.get("zoo")})
    table = table3(metrics)
    info = {
        "protocol": {**{b.name: b.protocol for b in known if b.protocol}, **UNCERTAINTY_PROTOCOL},
        "settings": {"choices": p.choices, "seeds": p.seeds, "training_seeds": train_seeds,
                     "n_seeds": len(train_seeds), "bootstrap": p.bootstrap, "ci": p.ci,
                     "recall_at": p.recall_at, "hierarcaps_batch": p.hierarcaps_batch,
                     "hierarcaps_radii": p.hierarcaps_radii, "fallback_negatives": p.fallback_negatives,
                     "negative_source": p.negative_source, "bootstrap_unit": p.bootstrap_unit,
                     "bootstrap_seed": params.run.seed},
        "models": models,
        "zoo_skipped": zoo_skipped,
        "items": {
            "n_test_images": len(items.image_ids), "n_groups": len(set(items.groups)),
            "skipped_images": dict(skipped), "ground_truth": items.has_ground_truth,
            "without_text": {f.name: f.n_without_text() for f in items.fields},
            "text_exclusions": items.text_exclusions,
            "generalized_leakage": (magic.stats.get("leakage") or leakage(magic))["train"]},
        **{key: value for b in known for key, value in b.absent.items()},
        "per_seed": per_seed,
        "embeddings_computed": {**run_store.computed, **own_store.computed},
    }
    for b, prepared in active:
        _merge_description(info, b.describe(prepared, per_model[b.name]))
    info["reading"] = read_results(metrics, differences, EvalResults(
        metrics, differences, table, info, out_dir).comparisons())
    paired = {k: paired_seeds({n: ms.scores for n, ms in v.items()}) for k, v in scores.items()}
    gains, gain_notes = gain_rows(metrics, paired, model_roles(models), p.bootstrap, p.ci, params.run.seed)
    changes = protocol_changes(metrics, paired, p.bootstrap, p.ci, params.run.seed)
    info["gains"] = {"notes": gain_notes}
    info["seconds"] = round(time.perf_counter() - start, 2)
    published = table3(metrics, "as_published")
    paths = write_results(out_dir, run, metrics, differences, table, info, scores, gains, seeds_table, published,
                          changes)
    return EvalResults(metrics=metrics, differences=differences, table3=table, info=info, directory=out_dir,
                       paths=paths, gains=gains, seeds=seeds_table, table3_published=published,
                       protocol_changes=changes)


def _magic_pixels_at(size: int, main: int, run: RunContext, magic, dataset: CaptionDataset, image_ids: list[str],
                     progress: bool, main_pixels: tuple[Callable[[], np.ndarray], str], cache: dict
                     ) -> tuple[Callable[[], np.ndarray], str]:
    """A zoo model's MAGIC test pixels at its own input size, on the same items.

    In-memory pixels are resized by the model (`pixels_to_tensor`); image files come from the run's image cache
    at that size (built once, reused). An item unreadable at that size is an error (the items must not change).
    """
    if size == main or dataset.pixels is not None:
        return main_pixels
    if size not in cache:
        fn, source, readable, _ = _test_pixels(run, magic, dataset, lambda: size, progress)
        missing = [i for i in image_ids if i not in readable]
        if missing:
            raise ValueError(f"{len(missing)} test images cannot be read at {size} px (first: {missing[0]})")
        cache[size] = (fn, source)
    return cache[size]
