"""Benchmark: what a full run of a paper profile costs at COCO's size, stage by stage, and which stage bounds it.

For COCO train2017 (118,287 images, ~591k captions) and `params/paper.yaml` (or --params), each stage's work, its
time and peak memory on this machine, and its projected time on the paper's hardware, with what runs where:

    data stages   captions, MAGIC build (Algorithm 1), image cache: CPU, measured by `bench_scale.py` (--scale-json;
                  its largest size, scaled to COCO by n log n when it is smaller)
    LLM           the l1..l4 chains and the generalized captions (`cglib.llm.estimate_full_coco`): the OpenAI API,
                  live at llm.concurrency requests in flight, or the Batch API (half price, results within its
                  24-hour completion window)
    training      every train.runs row under every training seed, `train.epochs` epochs of ~65k pairs in batches
                  of M x N: this machine's step time measured with `gpu_check.py --device cpu --arch vit-b-32`;
                  the GPU's from --gpu-pairs-per-s (gpu_check on the GPU), else the paper's own figure (about 3
                  hours for 5 epochs on one A5000), split over --gpus
    evaluation    every model and seed embeds the test split (20% of the images) once: this machine's ViT-B-32
                  forward measured here; the GPU's taken as 3x the training pairs/s (a forward pass is about a
                  third of a training step)

    python benchmarks/bench_scale.py --fractions 0.25,1 --truth-chains --json scale.json   # the data stages (~15 min)
    python benchmarks/bench_full_run.py --scale-json scale.json --gpus 1,8
    python benchmarks/bench_full_run.py --quick     # the data stages from a 1/256 run, extrapolated (minutes)

Every projected figure says its basis; nothing here is a measurement on a GPU unless --gpu-pairs-per-s is one.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cglib.llm.cost import COCO_TRAIN_IMAGES

PAPER_EPOCH_PAIRS = 65_000  # the paper's MAGIC: ~65k (image, generalized caption) training pairs per epoch
PAPER_A5000_HOURS = 3.0  # the paper: about 3 hours for 5 epochs on one A5000
PAPER_A5000_EPOCHS = 5
PAPER_PAIRS_PER_S = PAPER_A5000_EPOCHS * PAPER_EPOCH_PAIRS / (PAPER_A5000_HOURS * 3600)  # ~30 pairs/s
BATCH_WINDOW_H = 24.0  # the OpenAI Batch API's completion window
DATA_STAGES = {"captions": "captions (COCO json + image checks)", "magic": "MAGIC build + save (Algorithm 1)",
               "image_cache": "image cache"}


@dataclass
class Stage:
    name: str
    where: str
    work: str
    here_h: float | None  # on this machine (None: not run here)
    here_basis: str
    paper_h: float  # on the paper's hardware
    paper_basis: str
    peak_mb: float | None = None


def nlogn_scale(seconds: float, n: int, target: int) -> float:
    """Time at `target` items of a stage that took `seconds` at `n`, growing as n log n."""
    return seconds * (target * math.log(target)) / (n * math.log(n))


def data_stages(scale_rows: list[dict], target: int = COCO_TRAIN_IMAGES) -> list[Stage]:
    """The CPU stages from bench_scale's figures at its largest size (scaled to `target` images when smaller)."""
    row = max(scale_rows, key=lambda r: r["info"]["images"])
    n = row["info"]["images"]
    out = []
    for key, title in DATA_STAGES.items():
        s = row["stages"][key]
        hours = nlogn_scale(s["wall_s"], n, target) / 3600 if n < target else s["wall_s"] / 3600
        basis = (f"bench_scale at {n:,} images" + (", scaled by n log n" if n < target else ""))
        out.append(Stage(title, "CPU (one machine)", f"{target:,} images", hours, basis, hours,
                         "CPU-bound: the same on the paper's machine", s.get("peak_rss_mb")))
    return out


def llm_stage(params, seconds_per_request: float) -> list[Stage]:
    """The chains and the generalized captions: live at llm.concurrency, and through the Batch API."""
    from cglib.llm import estimate_full_coco  # lazy: after argument parsing, --help stays fast

    rows = estimate_full_coco(params)
    live = [r for r in rows if "(live)" in r["step"]]
    batch = [r for r in rows if "(Batch API)" in r["step"]]
    requests = sum(r["requests"] for r in live)
    concurrency = params.llm.concurrency
    live_h = requests * seconds_per_request / concurrency / 3600
    return [Stage("LLM, live", f"OpenAI API, {concurrency} requests in flight", f"{requests:,} requests, "
                  f"${sum(r['cost_usd'] for r in live):,.2f}", None, "needs the API", live_h,
                  f"{seconds_per_request:g} s per request (--llm-seconds-per-request; rate limits can lower it)"),
            Stage("LLM, Batch API", "OpenAI Batch API", f"{requests:,} requests, "
                  f"${sum(r['cost_usd'] for r in batch):,.2f}", None, "needs the API", BATCH_WINDOW_H,
                  "its completion window: at most 24 h, often less")]


def training_stage(params, step_s_here: float, gpu_pairs_per_s: float | None, gpus: int,
                   epoch_pairs: int = PAPER_EPOCH_PAIRS) -> Stage:
    """Every image-text row under every training seed: epochs x epoch_pairs pairs each (an RE row trains the text
    tower alone on text pairs, and the textual pretraining phases are text only: both left out, both small)."""
    t = params.train
    rows = sum(r.loss != "re" for r in t.runs) * len(t.seeds)
    pairs = rows * t.epochs * epoch_pairs
    per_step = t.groups_per_batch * t.pairs_per_group
    steps = math.ceil(pairs / per_step)
    if gpu_pairs_per_s:
        rate, basis = gpu_pairs_per_s, f"{gpu_pairs_per_s:g} pairs/s per GPU (--gpu-pairs-per-s, gpu_check)"
    else:
        rate = PAPER_PAIRS_PER_S
        basis = f"the paper's {PAPER_A5000_HOURS:g} h per {PAPER_A5000_EPOCHS} epochs on one A5000 ({rate:.1f} pairs/s)"
    where = "1 GPU" if gpus == 1 else f"{gpus} GPUs, each row data-parallel over all (train.processes: auto)"
    return Stage("training", where,
                 f"{rows} image-text rows x {t.epochs} epochs x {epoch_pairs:,} pairs = {steps:,} steps of {per_step}",
                 steps * step_s_here / 3600, f"{step_s_here:.2f} s per step here (ViT-B-32, fp32, CPU)",
                 pairs / rate / gpus / 3600, basis + (f", scaling linearly over {gpus} GPUs" if gpus > 1 else ""))


def evaluation_stage(params, images_per_s_here: float, gpu_pairs_per_s: float | None, gpus: int,
                     target: int = COCO_TRAIN_IMAGES) -> Stage:
    """Every model (zero-shot and each row under every seed, each eval.zoo model once) embeds the test images once
    (texts are few)."""
    t = params.train
    models = (len(t.runs) + 1) * len(t.seeds) + len(params.eval.zoo)
    images = round(target * params.magic.test_fraction)
    rate = 3 * (gpu_pairs_per_s or PAPER_PAIRS_PER_S)
    return Stage("evaluation", "1 GPU" if gpus == 1 else f"{gpus} GPUs", f"{models} models x {images:,} test images",
                 models * images / images_per_s_here / 3600, f"{images_per_s_here:.1f} images/s here (forward)",
                 models * images / rate / gpus / 3600, "3x the training pairs/s (a forward is ~1/3 of a step)"
                 + (f", over {gpus} GPUs" if gpus > 1 else ""))


def measure_step_s(threads: int) -> float:
    """Seconds per optimizer step of ViT-B-32 in fp32 on this CPU (gpu_check, the pairwise loss, 1+3 steps)."""
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--arch",
                           "vit-b-32", "--amp", "off", "--losses", "pairwise", "--steps", "3", "--warmup", "1",
                           "--threads", str(threads), "--cache-images", "64"],
                          capture_output=True, text=True, check=True, cwd=REPO)
    match = re.search(r"RESULT loss=pairwise .*step_ms=([0-9.e+-]+)", done.stdout)
    if match is None:
        raise RuntimeError("gpu_check printed no RESULT line:\n" + done.stdout[-2000:] + done.stderr[-2000:])
    return float(match.group(1)) / 1000


def measure_forward_images_per_s(params, threads: int, batch: int = 32, batches: int = 3) -> float:
    """Image embeddings per second of the profile's model on this CPU (its weights not downloaded: the speed does
    not depend on them)."""
    import torch

    from cglib.models import build_model

    torch.set_num_threads(threads)
    bundle = build_model(params.model.model_copy(update={"pretrained_weights": False}))
    pixels = torch.rand(batch, 3, bundle.image_size, bundle.image_size)
    with torch.no_grad():
        bundle.model.encode_image(pixels)  # warm-up
        start = time.perf_counter()
        for _ in range(batches):
            bundle.model.encode_image(pixels)
    return batch * batches / (time.perf_counter() - start)


def table(stages: list[Stage]) -> list[str]:
    """The markdown table and the line naming the stage that bounds a full run on the paper's hardware."""
    def h(x: float | None) -> str:
        return "-" if x is None else f"{x:,.2f} h"

    lines = ["| stage | runs on | work | this machine | basis | paper's hardware | basis | peak MB here |",
             "|---|---|---|---|---|---|---|---|"]
    for s in stages:
        lines.append(f"| {s.name} | {s.where} | {s.work} | {h(s.here_h)} | {s.here_basis} | {h(s.paper_h)} | "
                     f"{s.paper_basis} | {'-' if s.peak_mb is None else f'{s.peak_mb:,.0f}'} |")
    # the LLM has two ways to run; a full run takes the quicker one's place in the bound
    llm = [s for s in stages if s.name.startswith("LLM")]
    others = [s for s in stages if not s.name.startswith("LLM")]
    candidates = others + ([min(llm, key=lambda s: s.paper_h)] if llm else [])
    bound = max(candidates, key=lambda s: s.paper_h)
    total = sum(s.paper_h for s in candidates)
    lines.append(f"\nbounded by: {bound.name} ({bound.paper_h:,.1f} h of {total:,.1f} h in all on the paper's "
                 f"hardware, stages run one after another; the LLM counted as its quicker way)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=REPO / "params" / "paper.yaml")
    parser.add_argument("--scale-json", type=Path, help="bench_scale.py --json output (the data stages)")
    parser.add_argument("--quick", action="store_true", help="no --scale-json: run bench_scale at 1/256 here")
    parser.add_argument("--gpus", default="1", help="GPUs of the projection, comma-separated for several tables "
                        "(default 1, the paper's)")
    parser.add_argument("--gpu-pairs-per-s", type=float, help="training pairs/s per GPU measured by gpu_check")
    parser.add_argument("--llm-seconds-per-request", type=float, default=2.0,
                        help="latency of one chat request for the live projection (default 2 s)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for the CPU measurements")
    args = parser.parse_args(argv)
    if args.scale_json is None and not args.quick:
        parser.error("pass --scale-json FILE (from bench_scale.py --json) or --quick")

    from cglib.config import load_params

    params = load_params(args.params, check_paths=False)
    if args.scale_json is not None:
        scale_rows = json.loads(args.scale_json.read_text())
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "scale.json"
            subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_scale.py"), "--fractions", "0.00390625",
                            "--truth-chains", "--json", str(out)], check=True, cwd=REPO)
            scale_rows = json.loads(out.read_text())
    print(f"measuring ViT-B-32 on this CPU ({args.threads} threads): a training step, then a forward pass", flush=True)
    step_s = measure_step_s(args.threads)
    forward = measure_forward_images_per_s(params, args.threads)
    for gpus in (int(g) for g in args.gpus.split(",")):
        stages = [*data_stages(scale_rows), *llm_stage(params, args.llm_seconds_per_request),
                  training_stage(params, step_s, args.gpu_pairs_per_s, gpus),
                  evaluation_stage(params, forward, args.gpu_pairs_per_s, gpus)]
        print(f"\n{args.params.name} at COCO train2017's size ({COCO_TRAIN_IMAGES:,} images), {gpus} GPU"
              f"{'s' if gpus > 1 else ''}:\n")
        print("\n".join(table(stages)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
