"""Benchmark: the data stages at a fraction of COCO train2017's size (118,287 images, ~590k captions) on this CPU.

Stages, on the synthetic world (52 l1 concepts, 5 captions per image) written as COCO-format files, so the
COCO code path runs (files on disk, decoded by the same loaders as COCO):

    render        make_world (setup: the synthetic world in memory)
    export        write_coco_files (setup: captions JSON + one PNG per image)
    captions      load_coco_captions: parse the JSON, decode-check every image (the 01 stage)
    abstraction   run_abstraction with the offline backend (MiniLM caption embeddings, cache) (the 02 stage);
                  its l1 names then get LLM-like variety (`llm_like_chains`; --taxonomy-chains keeps the 52)
    dag           align_chains + ConceptDAG.from_chains + concept embeddings + merge_and_remove
    negatives     hard_negatives on every level (faiss)
    split         split_images (80/20 within each l1 node)
    magic         build_magic + save_outputs: all of Algorithm 1 as notebook 03 runs it (the three stages above
                  again, generalized captions by the offline backend, statistics, magic.json/graphml)
    image_cache   build_image_cache at --cache-size px from the PNG files (the 05 stage's first step)

For each stage: wall and CPU seconds, peak resident memory during the stage (sampled every 20 ms) and its rise
over the stage's start, and the disk the stage wrote. Each size runs in its own process (clean memory figures).
Between consecutive sizes it prints each stage's growth exponent log(t2/t1)/log(n2/n1) and the exponent that
n log n would have between the same sizes; a stage above it (by more than 0.15, on stages of >= 1 s) is flagged.

    python benchmarks/bench_scale.py --quick            # 1/256 and 1/64 of COCO (minutes)
    python benchmarks/bench_scale.py --fractions 0.0625,0.25
    python benchmarks/bench_scale.py --fractions 0.25,1 # the issue's sizes (1/1: ~1.2 GB of PNGs, 1.5 GB cache)
    python benchmarks/bench_scale.py --fractions 0.25,1 --truth-chains  # every stage but the abstraction (~15 min)
    python benchmarks/bench_scale.py --fractions 0.25,1 --truth-chains --max-hard-negatives 8 --negative-search hnsw

A 224 px cache of 118k images is about 18 GB: at full scale cache at the demo's 64 px (the default), or pass
--cache-size 224 --cache-sample 0.1 to cache a stated sample of the images at 224 px.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

COCO_TRAIN_IMAGES = 118_287
CONCEPTS = 52  # l1 concepts of the shipped taxonomy
STAGES = ("render", "export", "captions", "abstraction", "dag", "negatives", "split", "magic", "image_cache")
SETUP = ("render", "export")  # not pipeline stages: not checked for growth


class PeakRSS:
    """Samples this process's resident memory in a thread; `peak` since the last `reset`."""

    def __init__(self, every_s: float = 0.02) -> None:
        import psutil

        self.process, self.every_s, self.peak = psutil.Process(), every_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def rss(self) -> int:
        return self.process.memory_info().rss

    def reset(self) -> int:
        self.peak = now = self.rss()
        return now

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, self.rss())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def disk_bytes(*paths: Path) -> int:
    """Bytes of the files under `paths` (files or folders)."""
    total = 0
    for path in paths:
        if path.is_file():
            total += path.stat().st_size
        elif path.is_dir():
            total += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return total


ADJECTIVES = ("outdoor", "evening", "crowded", "small", "family", "winter", "summer", "busy", "quiet", "rainy",
              "morning", "local", "urban", "rural", "festive", "casual", "formal", "chaotic", "relaxed", "sunny",
              "indoor", "large", "private", "public", "modern", "old", "colorful", "noisy", "cozy", "early", "late",
              "weekend", "school", "office", "night", "spring", "autumn", "beach", "city", "village")


def llm_like_chains(chains: dict[str, list[str]], per_concept: int, seed: int = 0) -> dict[str, list[str]]:
    """Chains whose l1 names vary as an LLM's do on COCO: '<two modifiers> <l1>', Zipf-distributed.

    The offline backend can only answer the taxonomy's 52 l1 concepts, so its DAG has the same few nodes at
    every size and the DAG stages would never meet COCO's thousands of small l1 names. Here the number of
    distinct modifiers grows with the images per concept (up to 1,560), so distinct l1 names grow with n.
    """
    rng = np.random.default_rng(seed)
    vocab = [f"{a} {b}" for a in ADJECTIVES for b in ADJECTIVES if a != b]
    size = min(len(vocab), max(20, per_concept))
    weights = 1.0 / np.arange(1, size + 1) ** 1.1
    picks = rng.choice(size, size=len(chains), p=weights / weights.sum())
    return {image_id: [f"{vocab[k]} {chains[image_id][0]}", *chains[image_id][1:]]
            for image_id, k in zip(sorted(chains), picks)}


def run_one(fraction: float, cache_size: int, cache_sample: float, work: Path, threads: int,
            llm_like: bool = True, truth_chains: bool = False, magic: dict | None = None) -> dict:
    """All stages at one size in this process; returns the figures (json-ready)."""
    import torch

    from cglib.config import Params
    from cglib.data.coco import load_coco_captions
    from cglib.data.coco_export import write_coco_files
    from cglib.data.image_cache import build_image_cache
    from cglib.data.synthetic import make_world
    from cglib.embed import embed_texts
    from cglib.llm import run_abstraction
    from cglib.magic import build_magic, save_outputs
    from cglib.magic.build import align_chains
    from cglib.magic.dag import ConceptDAG
    from cglib.magic.embedders import embed_names, make_embedder
    from cglib.magic.merge import merge_and_remove
    from cglib.magic.negatives import level_negatives
    from cglib.magic.split import split_images

    torch.set_num_threads(threads)
    per_concept = max(2, round(fraction * COCO_TRAIN_IMAGES / CONCEPTS))
    params = Params.model_validate({"run": {"threads": threads, "seed": 0}, "llm": {"backend": "offline"},
                                    "data": {"image_cache_size": cache_size}, "magic": magic or {}})
    m = params.magic
    embed_texts(["warm-up"])  # loading MiniLM is a one-off per process, not a stage's cost
    make_embedder(params)(["warm-up"])
    memory = PeakRSS()
    stages: dict[str, dict] = {}
    info: dict = {}

    @contextmanager
    def stage(name: str, *outputs: Path):
        start_rss = memory.reset()
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        stages[name] = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "peak_rss_mb": round(memory.peak / 2**20),
                        "rss_rise_mb": round((memory.peak - start_rss) / 2**20), "disk_mb": round(
                            disk_bytes(*outputs) / 2**20, 1)}
        print(f"  {name:12s} {wall:8.2f} s wall {cpu:8.2f} s CPU  peak {memory.peak / 2**20:7.0f} MB "
              f"(+{(memory.peak - start_rss) / 2**20:.0f})  disk {stages[name]['disk_mb']:.1f} MB", flush=True)

    with stage("render"):
        world = make_world(images_per_concept=per_concept, seed=0, image_size=64, captions_per_image=5)
    n = len(world.dataset)
    info.update(images=n, captions=world.dataset.n_captions, fraction=fraction)
    print(f"fraction {fraction:g}: {n} images, {world.dataset.n_captions} captions", flush=True)
    coco_dir = work / "coco"
    with stage("export", coco_dir):
        files = write_coco_files(world.dataset, coco_dir / "annotations" / "captions_train.json", coco_dir / "images",
                                 workers=threads)
    world_truth = None
    if truth_chains:  # keyed as load_coco_captions keys the images: str(COCO id)
        world_truth = {str(files.coco_ids[i]): list(c) for i, c in world.ground_truth.items()}
    del world
    with stage("captions"):
        dataset = load_coco_captions(files.captions_json, files.image_dir)
    info["captions_skipped"] = dict(dataset.skipped)
    run_dir = work / "run"
    if truth_chains:  # the world's own chains stand in for the offline abstraction's (what it answers, or nearly)
        info["abstraction_failures"] = None
        found = world_truth
    else:
        with stage("abstraction", run_dir / "abstraction"):
            result = run_abstraction(dataset, params, run_dir, progress=False)
        info["abstraction_failures"] = len(result.failures)
        found = result.chains
    chains = llm_like_chains(found, per_concept) if llm_like else found
    info["distinct_l1_names"] = len({c[0] for c in chains.values()})
    with stage("dag"):
        usable, _ = align_chains(dataset, chains, m.l_max)
        dag = ConceptDAG.from_chains(usable, m.l_max)
        by_name = embed_names(make_embedder(params), [dag.name(x) for x in dag.graph.nodes])
        vectors = {x: by_name[dag.name(x)] for x in dag.graph.nodes}
        merge_and_remove(dag, vectors, m.size_min, m.sim_min)
    info["nodes_per_level"] = [len(dag.nodes_at(level)) for level in range(1, m.l_max + 1)]
    if dag.n_images == 0:
        raise SystemExit(f"every image was removed at fraction {fraction:g} (too few images per l1 name); use a "
                         "larger fraction or --taxonomy-chains")
    with stage("negatives"):
        found = level_negatives({level: dag.nodes_at(level) for level in range(1, m.l_max + 1)}, vectors, m, threads)
    pairs = sum(len(hard) for negatives in found.values() for hard in negatives.hard.values()) // 2
    searches = [negatives.search for negatives in found.values()]
    info.update(hard_negative_pairs=pairs, negative_search=searches)
    with stage("split"):
        split_images(dag.images, m.split, m.test_fraction, params.run.seed)
    del dag, vectors
    with stage("magic", run_dir / "magic"):
        magic = build_magic(dataset, chains, params, run_dir=run_dir, progress=False)
        save_outputs(magic, run_dir / "magic")
    info["magic_timing_s"] = magic.provenance.get("timing_s", {})
    del magic
    cache_dir = run_dir / "cache"
    sample = dataset
    if cache_sample < 1.0:
        rng = np.random.default_rng(0)
        keep = sorted(rng.choice(len(dataset), size=max(1, round(cache_sample * len(dataset))), replace=False))
        sample = dataset.subset([dataset.image_ids[i] for i in keep])
    info["cached_images"] = len(sample)
    with stage("image_cache", cache_dir):
        build_image_cache(sample, cache_size, cache_dir, progress=False)
    memory.stop()
    return {"info": info, "stages": stages}


def growth(rows: list[dict]) -> list[str]:
    """Lines comparing each stage's time growth between consecutive sizes with n log n's."""
    lines = []
    for a, b in itertools.pairwise(rows):
        n1, n2 = a["info"]["images"], b["info"]["images"]
        bound = 1 + math.log(math.log(n2) / math.log(n1)) / math.log(n2 / n1)
        lines.append(f"growth {n1} -> {n2} images (x{n2 / n1:.1f}); n log n exponent here: {bound:.2f}")
        for name in STAGES:
            sa, sb = a["stages"].get(name), b["stages"].get(name)
            if not sa or not sb:
                continue
            e_wall = math.log(max(sb["wall_s"], 1e-3) / max(sa["wall_s"], 1e-3)) / math.log(n2 / n1)
            e_cpu = math.log(max(sb["cpu_s"], 1e-3) / max(sa["cpu_s"], 1e-3)) / math.log(n2 / n1)
            e_mem = math.log(max(sb["rss_rise_mb"], 1) / max(sa["rss_rise_mb"], 1)) / math.log(n2 / n1)
            bad = (name not in SETUP and sb["wall_s"] >= 1.0 and min(e_wall, e_cpu) > bound + 0.15)
            flag = "  <-- WORSE THAN n log n" if bad else ""
            lines.append(f"  {name:12s} time exponent {e_wall:5.2f} wall {e_cpu:5.2f} CPU, memory-rise exponent "
                         f"{e_mem:5.2f}{flag}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fractions", default="0.25,1", help="comma-separated fractions of COCO train2017's size")
    parser.add_argument("--quick", action="store_true", help="1/256 and 1/64 (a few minutes)")
    parser.add_argument("--cache-size", type=int, default=64, help="image cache side in px (the demo's 64)")
    parser.add_argument("--cache-sample", type=float, default=1.0, help="fraction of images cached (e.g. 0.1 "
                        "at 224 px)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--taxonomy-chains", action="store_true", help="keep the offline backend's chains as they "
                        "are (52 l1 names at every size) instead of LLM-like l1 variety growing with n")
    parser.add_argument("--truth-chains", action="store_true", help="skip the abstraction stage (~90%% of the time "
                        "at full scale) and give the later stages the world's ground-truth chains, which the offline "
                        "backend reproduces nearly exactly (5,793 vs 5,805 l1 nodes at 1/1)")
    parser.add_argument("--max-hard-negatives", type=int, help="magic.max_hard_negatives (default: none, the paper)")
    parser.add_argument("--negative-search", choices=["auto", "exact", "hnsw"], default="auto",
                        help="magic.negative_search")
    parser.add_argument("--work", help="work folder (default: a temporary folder, removed afterwards)")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.add_argument("--one", type=float, help=argparse.SUPPRESS)  # internal: one size in this process
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 0 < args.cache_sample <= 1:
        parser.error("--cache-sample must be in (0, 1]")

    if args.one is not None:
        figures = run_one(args.one, args.cache_size, args.cache_sample, Path(args.work), args.threads,
                          llm_like=not args.taxonomy_chains, truth_chains=args.truth_chains,
                          magic={"max_hard_negatives": args.max_hard_negatives,
                                 "negative_search": args.negative_search})
        Path(args.out).write_text(json.dumps(figures))
        return

    fractions = [1 / 256, 1 / 64] if args.quick else [float(f) for f in args.fractions.split(",")]
    rows = []
    root = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="bench_scale-"))
    try:
        for fraction in sorted(fractions):
            work = root / f"f{fraction:g}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            out = work / "figures.json"
            cmd = [sys.executable, __file__, "--one", str(fraction), "--work", str(work), "--out", str(out),
                   "--cache-size", str(args.cache_size), "--cache-sample", str(args.cache_sample),
                   "--threads", str(args.threads), *(["--taxonomy-chains"] if args.taxonomy_chains else []),
                   *(["--truth-chains"] if args.truth_chains else []), "--negative-search", args.negative_search,
                   *(["--max-hard-negatives", str(args.max_hard_negatives)] if args.max_hard_negatives else [])]
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            subprocess.run(cmd, check=True, env=env)
            rows.append(json.loads(out.read_text()))
            shutil.rmtree(work / "coco", ignore_errors=True)  # the PNGs are the bulk of the disk
            shutil.rmtree(work / "run", ignore_errors=True)
    finally:
        if not args.work:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print("| images | captions | stage | wall s | CPU s | peak RSS MB | RSS rise MB | disk MB |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        for name in (x for x in STAGES if x in row["stages"]):
            s = row["stages"][name]
            print(f"| {row['info']['images']} | {row['info']['captions']} | {name} | {s['wall_s']:.2f} | "
                  f"{s['cpu_s']:.2f} | {s['peak_rss_mb']} | {s['rss_rise_mb']} | {s['disk_mb']} |")
    for row in rows:
        print(f"{row['info']['images']} images: {row['info']['distinct_l1_names']} distinct l1 names in the chains, "
              f"nodes per level {row['info']['nodes_per_level']}, {row['info']['hard_negative_pairs']} hard-negative "
              f"pairs ({', '.join(row['info']['negative_search'])} search per level), build_magic steps "
              f"{row['info']['magic_timing_s']}, cached {row['info']['cached_images']} images at "
              f"{args.cache_size} px, skipped {row['info']['captions_skipped'] or 'nothing'}")
    for line in growth(rows):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
