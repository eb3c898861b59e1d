"""Visualization costs: UMAP's numba compilation (cold vs cached) and attention extraction vs a plain forward.

Run: `python benchmarks/bench_viz.py`. Each UMAP case runs in a fresh process (numba compiles per process); the
baseline of each ratio is measured in the same run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import timeit

UMAP_CHILD = r"""
import json, os, sys, time, warnings
os.environ["NUMBA_CACHE_DIR"] = sys.argv[1]
t0 = time.perf_counter()
import numpy as np
import umap
t1 = time.perf_counter()
warnings.simplefilter("ignore")
x = np.random.default_rng(0).normal(size=(96, 384)).astype(np.float32)  # 48 groups x (image, text) centroids
umap.UMAP(n_neighbors=15, metric="cosine", random_state=0).fit_transform(x)
t2 = time.perf_counter()
umap.UMAP(n_neighbors=15, metric="cosine", random_state=0).fit_transform(x)
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "first_fit_s": t2 - t1, "second_fit_s": t3 - t2}))
"""


def umap_process(cache_dir: str) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", UMAP_CHILD, cache_dir], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_umap() -> None:
    with tempfile.TemporaryDirectory() as cache:
        cold = umap_process(cache)  # empty cache: everything compiles
        warm = umap_process(cache)  # cache filled by the first process
    print("UMAP of 96 centroids (384-d), fresh processes:")
    for key in ("import_s", "first_fit_s", "second_fit_s"):
        print(f"  {key:13s} empty cache {cold[key]:6.2f} s   filled cache {warm[key]:6.2f} s   "
              f"ratio {cold[key] / max(warm[key], 1e-9):5.1f}x")
    print(f"  first fit / second fit in one process (compile cost): {warm['first_fit_s'] / warm['second_fit_s']:.0f}x")


def bench_attention() -> None:
    import numpy as np

    from cglib.config import ModelParams
    from cglib.encoding import encode_images
    from cglib.models import build_model
    from cglib.viz.attention import extract_attention

    bundle = build_model(ModelParams(name="cglib-demo-vit", text_tower="open_clip"))
    pixels = np.random.default_rng(0).integers(0, 256, size=(64, 64, 64, 3), dtype=np.uint8)
    encode_images(bundle, pixels[:4])  # warm-up
    extract_attention(bundle, pixels[:4])

    base = min(timeit.repeat(lambda: encode_images(bundle, pixels), number=1, repeat=3))
    extract = min(timeit.repeat(lambda: extract_attention(bundle, pixels), number=1, repeat=3))
    print(f"demo ViT, 64 images: encode_images {base:.3f} s, extract_attention {extract:.3f} s "
          f"(ratio {extract / base:.2f}x)")


if __name__ == "__main__":
    bench_umap()
    bench_attention()
