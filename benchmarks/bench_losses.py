"""Forward+backward time of the CLEAR GLASS losses on CPU, as ratios to baselines measured in the same run.

Part 1 compares exact formulations of the pairwise inner term (Eq. 3) and checks they agree; cglib keeps the
fastest. Part 2 times every loss for M in {2, 8, 32} groups, N in {10, 16} pairs, L = 512, against (a) the
literal loop implementations of tests/reference_losses.py and (b) open_clip's ClipLoss on the same M*N pairs
(features L2-normalized inside the timed call, as the group losses do).

Part 3 times every loss with `text_ids` (duplicate texts within and across groups) against the same loss
without, as the masking overhead ratio; `--masking-only` runs just that part.

Times are CPU seconds of this process (time.process_time) on one thread by default, so that other jobs on a
shared machine do not distort them; `--wall --threads K` measures wall-clock time instead (quiet machine only).

    python benchmarks/bench_losses.py [--quick] [--wall] [--threads K] [--masking-only]

Targets at M=32, N=16: every group loss >= 20x faster than its loops; centroid <= 1.5x ClipLoss, pairwise <= 3x.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from open_clip.loss import ClipLoss
from torch.utils.benchmark import Timer

from cglib import losses

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import reference_losses as ref  # the literal loops live with the tests that check against them

TAU, TAU_INNER, ALPHA, DIM = 0.1, 0.1, 0.7, 512


# ------------------------------------------------------------- part 1: formulations of the pairwise inner term
def _inner_from_numerators(numerators: torch.Tensor, image: torch.Tensor, text: torch.Tensor,
                           centroid_norms: torch.Tensor, tau_inner: float) -> torch.Tensor:
    m, n, _ = image.shape
    norms = torch.bmm(image * image, (text * text).transpose(1, 2)).clamp_min(1e-24).sqrt().reshape(-1, 1)
    logits = numerators.reshape(m * n * n, m) / norms / centroid_norms / tau_inner
    return F.cross_entropy(logits, torch.arange(m).repeat_interleave(n * n))


def inner_cglib(image: torch.Tensor, text: torch.Tensor, tau_inner: float) -> torch.Tensor:
    """cglib's choice: bmm per centroid when M < N, else materialized."""
    return losses.paper._pairwise_inner(image, text, tau_inner, normalize_products=False)


def inner_materialized(image: torch.Tensor, text: torch.Tensor, tau_inner: float) -> torch.Tensor:
    """The (M*N*N, L) combined vectors I_i * T_j times the (M, L) centroids."""
    m, n, dim = image.shape
    centroids = image.mean(dim=1) * text.mean(dim=1)
    numerators = (image.unsqueeze(2) * text.unsqueeze(1)).reshape(m * n * n, dim) @ centroids.T
    return _inner_from_numerators(numerators, image, text, centroids.norm(dim=-1), tau_inner)


def inner_per_centroid_bmm(image: torch.Tensor, text: torch.Tensor, tau_inner: float) -> torch.Tensor:
    """Factorization of Eq. 1: <I_i * T_j, mu_h> = (I_i * mu_h) . T_j, one batched matmul per group."""
    m, n, dim = image.shape
    centroids = image.mean(dim=1) * text.mean(dim=1)
    scaled = (image.unsqueeze(2) * centroids[None, None]).reshape(m, n * m, dim)  # (M, N*M_h, L)
    numerators = torch.bmm(scaled, text.transpose(1, 2)).reshape(m, n, m, n).permute(0, 1, 3, 2)
    return _inner_from_numerators(numerators, image, text, centroids.norm(dim=-1), tau_inner)


def inner_einsum(image: torch.Tensor, text: torch.Tensor, tau_inner: float) -> torch.Tensor:
    """The same contraction left to torch.einsum: sum_l I[g,i,l] T[g,j,l] mu[h,l]."""
    centroids = image.mean(dim=1) * text.mean(dim=1)
    numerators = torch.einsum("gil,gjl,hl->gijh", image, text, centroids)
    return _inner_from_numerators(numerators, image, text, centroids.norm(dim=-1), tau_inner)


FORMULATIONS = {"materialized": inner_materialized, "bmm per centroid": inner_per_centroid_bmm,
                "einsum": inner_einsum, "cglib (adaptive)": inner_cglib}


# --------------------------------------------------------------------------------------------- timing
def features(m: int, n: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Random (M, N, L) leaves that require grad."""
    gen = torch.Generator().manual_seed(seed)
    image = torch.randn(m, n, DIM, generator=gen, dtype=dtype).requires_grad_()
    text = torch.randn(m, n, DIM, generator=gen, dtype=dtype).requires_grad_()
    return image, text


def fwd_bwd(loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], image: torch.Tensor,
            text: torch.Tensor) -> Callable[[], None]:
    """A closure running one forward and backward pass (gradients reset so they never accumulate)."""
    def step() -> None:
        image.grad = text.grad = None
        loss_fn(image, text).backward()
    return step


CLOCK: Callable[[], float] = time.process_time  # CPU time of this process; --wall switches to time.perf_counter


def robust_ms(steps: dict[str, Callable[[], None]], rounds: int, min_run_time: float) -> dict[str, float]:
    """Milliseconds per call of each step: the best over `rounds` interleaved rounds of the median of a
    torch.utils.benchmark window (interleaving and the best round damp the drift of a shared machine)."""
    best = {name: float("inf") for name in steps}
    for step in steps.values():
        step()  # warm-up
    for _ in range(rounds):
        for name, step in steps.items():
            timer = Timer(stmt="step()", globals={"step": step}, timer=CLOCK, num_threads=torch.get_num_threads())
            best[name] = min(best[name], timer.blocked_autorange(min_run_time=min_run_time).median * 1e3)
    return best


def once_ms(step: Callable[[], None]) -> float:
    """Milliseconds of a single call (for the slow loop references)."""
    start = CLOCK()
    step()
    return (CLOCK() - start) * 1e3


def compare_formulations(sizes: list[tuple[int, int]], rounds: int, min_run_time: float) -> None:
    print("Part 1: pairwise inner term (Eq. 3), forward+backward ms (|difference| to the materialized value)")
    print(f"{'M':>3} {'N':>3} " + " ".join(f"{name:>22}" for name in FORMULATIONS))
    for m, n in sizes:
        image, text = features(m, n)
        unit_image, unit_text = F.normalize(image, dim=-1), F.normalize(text, dim=-1)
        reference = inner_materialized(unit_image, unit_text, TAU_INNER).item()
        errors, steps = {}, {}
        for name, fn in FORMULATIONS.items():
            errors[name] = abs(fn(unit_image, unit_text, TAU_INNER).item() - reference)

            def loss(i: torch.Tensor, t: torch.Tensor, fn=fn) -> torch.Tensor:
                return fn(F.normalize(i, dim=-1), F.normalize(t, dim=-1), TAU_INNER)

            steps[name] = fwd_bwd(loss, image, text)
        times = robust_ms(steps, rounds, min_run_time)
        print(f"{m:>3} {n:>3} " + " ".join(f"{f'{times[k]:9.2f} ({errors[k]:.0e})':>22}" for k in FORMULATIONS))


def duplicate_ids(m: int, n: int, seed: int = 0) -> torch.Tensor:
    """(M, N) text ids drawn from M*N/2 values: about half the texts have a twin, inside or across groups."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, max(1, m * n // 2), (m, n), generator=gen)


def masking_overhead(rounds: int, min_run_time: float) -> None:
    print("\nPart 3: masking overhead, forward+backward ms with text_ids (duplicates) / without")
    header = f"{'M':>3} {'N':>3} {'loss':<26} {'plain ms':>9} {'ids ms':>9} {'ratio':>7}"
    print(header)
    print("-" * len(header))
    for m in (2, 8, 32):
        for n in (10, 16):
            image, text = features(m, n)
            ids = duplicate_ids(m, n)
            calls = {
                "clip_loss": lambda i, t, ids: losses.clip_loss(i, t, TAU, text_ids=ids),
                "pairwise": lambda i, t, ids: losses.pairwise_group_loss(i, t, TAU, TAU_INNER, ALPHA, text_ids=ids),
                "centroid": lambda i, t, ids: losses.centroid_group_loss(i, t, TAU, TAU_INNER, ALPHA, text_ids=ids),
                "text_alignment_loss": lambda i, t, ids: losses.text_alignment_loss(
                    i.reshape(-1, DIM), t.reshape(-1, DIM), TAU, text_ids=None if ids is None else ids.reshape(-1)),
            }
            steps = {}
            for name, call in calls.items():
                steps[(name, "plain")] = fwd_bwd(lambda i, t, call=call: call(i, t, None), image, text)
                steps[(name, "ids")] = fwd_bwd(lambda i, t, call=call, ids=ids: call(i, t, ids), image, text)
            times = robust_ms(steps, rounds, min_run_time)
            for name in calls:
                plain, masked = times[(name, "plain")], times[(name, "ids")]
                print(f"{m:>3} {n:>3} {name:<26} {plain:9.2f} {masked:9.2f} {masked / plain:6.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short timing windows; loops only up to M=8")
    parser.add_argument("--wall", action="store_true", help="wall-clock instead of process CPU time")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (CPU time needs 1; 0 = torch default)")
    parser.add_argument("--masking-only", action="store_true", help="only part 3 (text_ids masking overhead)")
    args = parser.parse_args()
    global CLOCK
    if args.wall:
        CLOCK = time.perf_counter
    elif args.threads != 1:
        parser.error("CPU time counts every thread's work (and OpenMP spinning): use --threads 1, or add --wall")
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds, min_run_time = (2, 0.1) if args.quick else (3, 0.2)
    clock = "wall-clock" if args.wall else "process CPU"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {clock} time, L={DIM}, tau={TAU}, "
          f"tau'={TAU_INNER}\n")
    if args.masking_only:
        masking_overhead(rounds, min_run_time)
        return

    compare_formulations([(2, 10), (8, 16), (32, 10), (32, 16), (64, 4)], rounds, min_run_time)

    open_clip_loss = ClipLoss()

    def open_clip_baseline(i: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return open_clip_loss(F.normalize(i.reshape(-1, DIM), dim=-1), F.normalize(t.reshape(-1, DIM), dim=-1),
                              logit_scale=1 / TAU)

    ours = {
        "clip_loss": (lambda i, t: losses.clip_loss(i, t, TAU),
                      lambda i, t: ref.ref_clip_loss(i.reshape(-1, DIM), t.reshape(-1, DIM), TAU)),
        "pairwise": (lambda i, t: losses.pairwise_group_loss(i, t, TAU, TAU_INNER, ALPHA),
                     lambda i, t: ref.ref_pairwise_loss(i, t, TAU, TAU_INNER, ALPHA)),
        "pairwise (norm. products)": (
            lambda i, t: losses.pairwise_group_loss(i, t, TAU, TAU_INNER, ALPHA, normalize_products=True),
            lambda i, t: ref.ref_pairwise_loss(i, t, TAU, TAU_INNER, ALPHA, normalize_products=True)),
        "centroid": (lambda i, t: losses.centroid_group_loss(i, t, TAU, TAU_INNER, ALPHA),
                     lambda i, t: ref.ref_centroid_loss(i, t, TAU, TAU_INNER, ALPHA)),
    }
    print("\nPart 2: forward+backward ms; speed-up = loops / loss; vs ClipLoss = loss / open_clip ClipLoss")
    header = f"{'M':>3} {'N':>3} {'loss':<26} {'ms':>9} {'loops ms':>10} {'speed-up':>9} {'ClipLoss ms':>12} {'vs ClipLoss':>11}"
    print(header)
    print("-" * len(header))
    for m in (2, 8, 32):
        for n in (10, 16):
            image, text = features(m, n)
            steps = {name: fwd_bwd(fast, image, text) for name, (fast, _) in ours.items()}
            times = robust_ms({**steps, "open_clip": fwd_bwd(open_clip_baseline, image, text)}, rounds, min_run_time)
            for name, (_, loops) in ours.items():
                if args.quick and m > 8:
                    loops_ms, speedup = float("nan"), "-"
                else:
                    loops_ms = once_ms(fwd_bwd(loops, image, text))
                    speedup = f"{loops_ms / times[name]:.0f}x"
                print(f"{m:>3} {n:>3} {name:<26} {times[name]:9.2f} {loops_ms:10.0f} {speedup:>9} "
                      f"{times['open_clip']:12.2f} {times[name] / times['open_clip']:10.2f}x", flush=True)
    masking_overhead(rounds, min_run_time)


if __name__ == "__main__":
    main()
