"""GPU check: the paper profile's training step (ViT-B-32, the profile's precision on CUDA) with each loss and
open_clip's ClipLoss.

For each of clip, pairwise, centroid (cglib.losses) and open_clip's ClipLoss it runs `--steps` timed training
steps after `--warmup` untimed ones, each step as training takes it: a batch of M groups x N pairs (params/
paper.yaml: M=2, N=10) read from an image cache (random pixels, memory-mapped uint8, as
`cglib.data.image_cache` builds it) and tokenized captions through a torch DataLoader with worker processes,
normalised on the device, both towers forward (the open_clip text tower trains), the loss, backward, gradient
clipping, AdamW (the project's weight-decay split, the profile's betas and eps) and the warmup-cosine schedule,
at the profile's train.amp: params/paper.yaml (as published) runs fp16 autocast with a GradScaler on CUDA, as the
authors did; params/paper_corrected.yaml bf16. It prints, per loss:

    pairs/s            image-text pairs through a whole step per second (M*N per step)
    peak memory        torch.cuda.max_memory_allocated on CUDA; the process's peak RSS on CPU
    data wait          share of step time spent waiting for the DataLoader
    forward/loss/backward/optimizer   share of step time in each phase (the device is synchronised between
                       phases, so the shares are exact and the pairs/s slightly conservative on CUDA)
    projected          wall time of the paper's 5 epochs of ~65k pairs under the `pairs` epoch (every pair an
                       anchor once per epoch: ceil(65,000 / N) steps per epoch) at this step time
    vs ClipLoss        pairs/s relative to open_clip's ClipLoss in the same run (the figure any device keeps)

and one machine-readable line per loss starting with `RESULT` (key=value pairs).

    python benchmarks/gpu_check.py                        # CUDA: ViT-B-32 at 224 px, fp16 + GradScaler, 50 steps
    python benchmarks/gpu_check.py --params params/paper_corrected.yaml   # ... bf16 (the corrected protocol)
    python benchmarks/gpu_check.py --weights              # ... with OpenAI's weights (downloads once)
    python benchmarks/gpu_check.py --device cpu --steps 5 # CPU: the rehearsal's small towers, fp32, 1 thread

Without --weights the `openai` tag is resolved (activation, preprocessing) but its weights are not fetched:
throughput does not depend on weight values.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import open_clip
import torch
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from cglib.config import ModelParams, load_params
from cglib.data.dataset import CaptionDataset
from cglib.data.image_cache import ImageCache, build_image_cache
from cglib.encoding import pixels_to_tensor
from cglib.models import ClipModel, Towers, build_model
from cglib.train.objectives import OBJECTIVES, GroupFeatures, objective_with
from cglib.train.optim import amp_dtype, build_optimizer, warmup_cosine

# the paper's image-text objectives from the registry, then open_clip's own ClipLoss as the reference
LOSSES = (*(name for name, cls in OBJECTIVES.items() if cls.phase == "train" and not cls.related), "openclip")
PHASES = ("data", "forward", "loss", "backward", "optimizer")
SHARE_KEYS = {"forward": "forward", "loss": "loss_share", "backward": "backward", "optimizer": "optimizer"}
WORDS = ("dog", "cake", "balloon", "tennis", "racket", "train", "harbor", "boat", "skis", "snow", "table", "lamp",
         "child", "candle", "picnic", "basket", "farm", "tractor", "kitchen", "bread")


class BatchSource(torch.utils.data.Dataset):
    """Step k's batch: M*N cached images (memmap) and M*N distinct captions, tokenized in the worker."""

    def __init__(self, cache: ImageCache, tokenizer, pairs: int, seed: int = 0) -> None:
        self.cache, self.tokenizer, self.pairs, self.seed = cache, tokenizer, pairs, seed

    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, k: int) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng([self.seed, k])
        rows = rng.choice(len(self.cache), size=self.pairs, replace=len(self.cache) < self.pairs)
        ids = [self.cache.image_ids[r] for r in rows]
        texts = [f"a photo of {' and '.join(rng.choice(WORDS, size=4))} number {k * self.pairs + i}"
                 for i in range(self.pairs)]
        return {"pixels": torch.from_numpy(self.cache.get(ids)), "tokens": self.tokenizer(texts)}


def random_cache(n: int, size: int, directory: Path) -> ImageCache:
    """An image cache of `n` random uint8 images (built by cglib's image cache, memory-mapped on read)."""
    pixels = np.random.default_rng(0).integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)
    ids = [f"img{i:06d}" for i in range(n)]
    dataset = CaptionDataset(source="gpu_check", image_ids=ids, captions={i: ["x"] for i in ids}, pixels=pixels)
    return build_image_cache(dataset, size, directory, progress=False)


def model_params(arch: str, weights: bool) -> ModelParams:
    """The paper's model section (ViT-B-32, openai tag, trainable text tower), or the rehearsal's shrunken one."""
    paper = load_params(REPO / "params" / "paper.yaml", check_paths=False).model
    if arch == "vit-b-32":
        return paper.model_copy(update={"pretrained_weights": weights})
    rehearsal = yaml.safe_load((REPO / "params" / "rehearsal.yaml").read_text(encoding="utf-8"))["model"]
    return ModelParams.model_validate(rehearsal)


def make_loss(name: str, t) -> callable:
    """The objective `name` of the registry on (M, N, D) features with the paper profile's tau, tau', alpha."""
    if name in OBJECTIVES:
        objective = objective_with(name, t.tau, tau_inner=t.tau_inner, alpha=t.alpha)
        return lambda i, x: objective(GroupFeatures(i, x))["loss"]
    clip = open_clip.loss.ClipLoss()
    scale = 1.0 / t.tau  # the same fixed temperature as the project's clip loss
    return lambda i, x: clip(i.reshape(-1, i.shape[-1]), x.reshape(-1, x.shape[-1]), scale)


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA memory allocated since the last reset, or this process's peak RSS on CPU (MB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def run_loss(name: str, bundle: ClipModel, batches, args, t, device: torch.device, amp: torch.dtype | None) -> dict:
    """Warmup then timed steps of one loss; phase seconds, pairs/s and peak memory."""
    towers = Towers(bundle.model)
    loss_fn = make_loss(name, t)
    optimizer = build_optimizer(bundle.model, t.lr, t.weight_decay, betas=t.adam_betas, eps=t.adam_eps)
    scaler = torch.amp.GradScaler(device.type, enabled=amp is torch.float16)  # as training: fp16 needs scaling
    total = args.warmup + args.steps
    scheduler = warmup_cosine(optimizer, min(t.warmup_steps, total - 1), total)
    m, n = t.groups_per_batch, t.pairs_per_group
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)

    def sync() -> tuple[float, float]:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter(), time.process_time()

    spent: Counter = Counter()  # wall seconds per phase
    spent_cpu: Counter = Counter()  # this process's CPU seconds per phase (all its threads)
    losses_seen = []
    for step in range(total):
        t0 = sync()
        item = next(batches)
        t1 = sync()
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            images = pixels_to_tensor(item["pixels"].to(device, non_blocking=True), bundle)
            image, text = towers(images, item["tokens"].to(device, non_blocking=True))
            t2 = sync()
            loss = loss_fn(image.reshape(m, n, -1), text.reshape(m, n, -1))
            t3 = sync()
        scaler.scale(loss).backward()
        t4 = sync()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_([p for p in bundle.model.parameters() if p.requires_grad], t.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        t5 = sync()
        losses_seen.append(float(loss.detach()))
        if step >= args.warmup:
            marks = (t0, t1, t2, t3, t4, t5)
            for phase, a, b in zip(PHASES, marks, marks[1:]):
                spent[phase] += b[0] - a[0]
                spent_cpu[phase] += b[1] - a[1]
    if not all(math.isfinite(x) for x in losses_seen):
        raise RuntimeError(f"{name}: non-finite loss {losses_seen}")
    step_s = sum(spent.values()) / args.steps
    steps_per_epoch = math.ceil(args.epoch_pairs / n)
    # On a CPU shared with other processes wall time measures the neighbours too; this process's CPU time does
    # not, so on CPU the shares and the ratio to ClipLoss come from CPU time (wall time on CUDA: the GPU works
    # while the CPU waits).
    basis = spent_cpu if device.type == "cpu" else spent
    out = {"loss": name, "pairs_per_s": m * n / step_s, "step_ms": 1e3 * step_s,
           "pairs_per_basis_s": m * n * args.steps / sum(basis.values()),
           "peak_mem_mb": peak_memory_mb(device), "data_wait": spent["data"] / sum(spent.values()),
           **{SHARE_KEYS[phase]: basis[phase] / sum(basis.values()) for phase in PHASES[1:]},
           "projected_h": args.epochs * steps_per_epoch * step_s / 3600, "final_loss": losses_seen[-1]}
    del optimizer, scheduler
    gc.collect()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--arch", choices=("vit-b-32", "rehearsal"), help="the paper's ViT-B-32 (default on CUDA) "
                        "or the rehearsal profile's small towers on the same code path (default on CPU)")
    parser.add_argument("--weights", action="store_true", help="download and load OpenAI's weights")
    parser.add_argument("--params", type=Path, default=REPO / "params" / "paper.yaml", help="the profile whose "
                        "train section (M, N, optimizer, train.amp) the check runs (default: params/paper.yaml)")
    parser.add_argument("--amp", choices=("profile", "bf16", "fp16", "off"), default="profile",
                        help="profile (default): the profile's train.amp (paper.yaml: fp16 with a GradScaler on "
                        "CUDA; every profile: fp32 on CPU); fp16 and bf16 need CUDA")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per loss")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per loss before timing")
    parser.add_argument("--num-workers", type=int, help="DataLoader workers (default: train.num_workers of "
                        "paper.yaml on CUDA, 0 on CPU)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: 1 on CPU, where one thread keeps "
                        "the figures stable on a machine shared with other work; unchanged on CUDA)")
    parser.add_argument("--cache-images", type=int, default=2048, help="random images in the image cache")
    parser.add_argument("--epoch-pairs", type=int, default=65_000, help="training pairs per epoch (paper: ~65k)")
    parser.add_argument("--epochs", type=int, help="epochs of the projection (default: train.epochs of paper.yaml)")
    parser.add_argument("--losses", default=",".join(LOSSES), help=f"comma-separated subset of {LOSSES}")
    args = parser.parse_args(argv)
    names = args.losses.split(",")
    if not names or any(x not in LOSSES for x in names) or args.steps < 1 or args.warmup < 0:
        parser.error(f"--losses must be a subset of {LOSSES}; --steps >= 1, --warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device here; run with --device cpu (small towers, fp32) for the CPU figures",
              file=sys.stderr)
        return 2
    device = torch.device(args.device)
    threads = args.threads or (1 if device.type == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    paper = load_params(args.params, check_paths=False)
    t = paper.train
    args.epochs = args.epochs or t.epochs
    arch = args.arch or ("vit-b-32" if device.type == "cuda" else "rehearsal")
    if args.amp in ("bf16", "fp16") and device.type != "cuda":
        print(f"error: --amp {args.amp} needs CUDA; on CPU use --amp off (or profile: fp32)", file=sys.stderr)
        return 2
    amp = amp_dtype(t.amp if args.amp == "profile" else args.amp, device)
    amp_name = {torch.bfloat16: "bf16", torch.float16: "fp16 + GradScaler", None: "off (fp32)"}[amp]
    amp_name += f" (train.amp: {t.amp} of {args.params.name})" if args.amp == "profile" else ""
    workers = args.num_workers if args.num_workers is not None else (t.num_workers if device.type == "cuda" else 0)

    bundle = build_model(model_params(arch, args.weights), device=device)
    bundle.freeze_logit_scale()  # as training does: the project's losses use a fixed tau
    bundle.model.train()
    n_params = sum(p.numel() for p in bundle.model.parameters())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({os.cpu_count()} cores, " \
        f"{torch.get_num_threads()} torch threads)"
    m, n = t.groups_per_batch, t.pairs_per_group
    print(f"device: {name}; model {bundle.name} ({arch}, {n_params / 1e6:.1f}M parameters, {bundle.image_size} px, "
          f"weights {'loaded' if args.weights and arch == 'vit-b-32' else 'random'}); amp {amp_name}; "
          f"M={m} N={n}; {args.warmup}+{args.steps} steps per loss; DataLoader workers {workers}")
    with tempfile.TemporaryDirectory() as tmp:
        cache = random_cache(args.cache_images, bundle.image_size, Path(tmp))
        source = BatchSource(cache, bundle.tokenizer, m * n)
        loader = torch.utils.data.DataLoader(source, batch_size=None, num_workers=workers,
                                             pin_memory=device.type == "cuda", persistent_workers=workers > 0)
        batches = iter(loader)
        results = [run_loss(x, bundle, batches, args, t, device, amp) for x in names]
        del batches, loader
    base = next((r["pairs_per_basis_s"] for r in results if r["loss"] == "openclip"), None)
    basis = "CPU time of this process" if device.type == "cpu" else "wall time"
    print(f"\nshares of a step and the ratio to ClipLoss from {basis}; pairs/s, data wait and the projection from "
          "wall time")
    print(f"| loss | pairs/s | step ms | peak {'GPU' if device.type == 'cuda' else 'RSS'} MB | data wait | forward "
          f"| loss | backward | optimizer | projected {args.epochs} x {args.epoch_pairs} pairs | vs ClipLoss |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        r["vs_clip_loss"] = r["pairs_per_basis_s"] / base if base else float("nan")
        print(f"| {r['loss']} | {r['pairs_per_s']:.1f} | {r['step_ms']:.1f} | {r['peak_mem_mb']:.0f} | "
              f"{r['data_wait']:.1%} | {r['forward']:.1%} | {r['loss_share']:.1%} | {r['backward']:.1%} | "
              f"{r['optimizer']:.1%} | {r['projected_h']:.2f} h | {r['vs_clip_loss']:.3f} |")
    for r in results:
        keys = ("pairs_per_s", "step_ms", "peak_mem_mb", "data_wait", "forward", "loss_share", "backward",
                "optimizer", "projected_h", "vs_clip_loss")
        print(f"RESULT loss={r['loss']} " + " ".join(f"{k}={r[k]:.6g}" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
