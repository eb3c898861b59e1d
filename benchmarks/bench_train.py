"""Training throughput: one optimizer step with each cglib loss against the same step with open_clip's ClipLoss.

Same model, same batch (M groups x N pairs), same AdamW/clipping step (cglib.train.step.Stepper); only the loss
differs. Variants are interleaved over the repeats so machine load drifts hit all of them alike; medians are
reported as images/s and as extra cost over ClipLoss (target: group losses under 10% extra). A second table
times the loss alone (forward + backward on fixed features).

    python benchmarks/bench_train.py                                   # demo model on CPU
    python benchmarks/bench_train.py --device cuda --model ViT-B-32    # the paper's model (random init) on a GPU
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from open_clip.loss import ClipLoss

from cglib.config import ModelParams
from cglib.encoding import pixels_to_tensor
from cglib.losses import centroid_group_loss, clip_loss, pairwise_group_loss
from cglib.models import Towers, build_model
from cglib.train.step import Stepper, set_trainable

TAU = 0.1


def loss_functions() -> dict:
    """Every variant: name -> f(image (M, N, L), text (M, N, L)) -> scalar loss."""
    open_clip_loss = ClipLoss()

    def reference(image, text):
        dim = image.shape[-1]
        return open_clip_loss(image.reshape(-1, dim), text.reshape(-1, dim), torch.tensor(1 / TAU))

    return {
        "open_clip ClipLoss": reference,
        "cglib clip": lambda i, t: clip_loss(i, t, TAU),
        "cglib pairwise": lambda i, t: pairwise_group_loss(i, t, TAU, TAU, 0.7),
        "cglib pairwise (authors' inner)": lambda i, t: pairwise_group_loss(i, t, TAU, TAU, 0.7,
                                                                            normalize_products=True),
        "cglib centroid": lambda i, t: centroid_group_loss(i, t, TAU, TAU, 0.7),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default="cglib-demo-vit")
    parser.add_argument("--groups", type=int, default=None, help="M (default: 4 demo, 2 paper)")
    parser.add_argument("--pairs", type=int, default=None, help="N (default: 8 demo, 10 paper)")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per variant (default 10 CPU, 50 GPU)")
    parser.add_argument("--amp", choices=["off", "bf16"], default=None, help="default: bf16 on cuda, off on CPU")
    parser.add_argument("--freeze-text", choices=["yes", "no"], default=None,
                        help="default: yes for cglib configs (MiniLM, precomputed), no for open_clip models (paper)")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    paper = not args.model.startswith("cglib-")
    m = args.groups or (2 if paper else 4)
    n = args.pairs or (10 if paper else 8)
    repeats = args.repeats or (50 if device.type == "cuda" else 10)
    amp = (args.amp or ("bf16" if device.type == "cuda" else "off")) == "bf16"
    freeze = (args.freeze_text or ("no" if paper else "yes")) == "yes"

    torch.manual_seed(0)
    params = ModelParams(name=args.model, text_tower="open_clip" if paper else "minilm", freeze_text=freeze)
    bundle = build_model(params, device)
    set_trainable(bundle, image=True, text=not freeze)
    bundle.model.train()
    towers = Towers(bundle.model)
    rng = np.random.default_rng(0)
    pixels = torch.from_numpy(rng.integers(0, 256, size=(m * n, bundle.image_size, bundle.image_size, 3),
                                           dtype=np.uint8))
    # N texts per group cycling over 5 generalized captions, as the sampler pairs them
    texts = [f"group {g} shares generalized caption {k % 5}" for g in range(m) for k in range(n)]
    unique = sorted(set(texts))
    inverse = torch.tensor([unique.index(t) for t in texts], device=device)
    tokens = bundle.tokenizer(unique).to(device)
    with torch.no_grad():
        table = bundle.model.encode_text(tokens, normalize=True).float()

    def make_step(loss):
        def loss_fn(_):
            images = pixels_to_tensor(pixels.to(device, non_blocking=True), bundle)
            image, text = towers(images, None if freeze else tokens)
            text = table[inverse] if freeze else text[inverse]
            return {"loss": loss(image.reshape(m, n, -1), text.reshape(m, n, -1))}
        return loss_fn

    variants = loss_functions()
    stepper = Stepper(bundle.model, towers, lr=1e-6, weight_decay=0.1, warmup_steps=0,
                      total_steps=10 * repeats * len(variants) + 10, amp=torch.bfloat16 if amp else None,
                      grad_clip=1.0, device=device)
    steps = {name: make_step(loss) for name, loss in variants.items()}

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for name in variants:  # warm-up: allocator, kernels, autotuning
        for _ in range(2):
            stepper.step([None], steps[name])
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name in variants:
            sync()
            tick = time.perf_counter()
            stepper.step([None], steps[name])
            sync()
            times[name].append(time.perf_counter() - tick)

    dim = bundle.embed_dim
    gen = torch.Generator(device="cpu").manual_seed(1)
    feats = [torch.randn(m, n, dim, generator=gen).to(device).requires_grad_() for _ in range(2)]
    loss_times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(max(20, repeats)):
        for name, loss in variants.items():
            sync()
            tick = time.perf_counter()
            loss(*feats).backward()
            sync()
            loss_times[name].append(time.perf_counter() - tick)

    base = statistics.median(times["open_clip ClipLoss"])
    print(f"model {args.model} on {device} ({'bf16' if amp else 'fp32'}), text tower "
          f"{'frozen, precomputed' if freeze else 'trained'}, batch M={m} x N={n} = {m * n} images, "
          f"{repeats} timed steps per variant, torch threads {torch.get_num_threads()}")
    print(f"{'variant':34s} {'step ms':>9s} {'images/s':>9s} {'vs ClipLoss':>12s} {'loss-only ms':>13s}")
    for name in variants:
        step = statistics.median(times[name])
        alone = statistics.median(loss_times[name]) * 1e3
        print(f"{name:34s} {step * 1e3:9.1f} {m * n / step:9.1f} {(step / base - 1) * 100:+11.1f}% {alone:13.3f}")


if __name__ == "__main__":
    main()
