"""What fixed-shape encoding costs: texts and images embedded as cglib.encoding does (every call of a tower of one
shape, so an embedding depends on its item alone) against the earlier batching (texts sorted by length in chunks
of 256 cut to the chunk's longest text; images in chunks of 256, the last one short), in the same run.

    python benchmarks/bench_encoding.py [N_TEXTS] [N_IMAGES]

The demo's model (cglib-demo-vit + MiniLM), demo-like captions and random 64 px images; prints best-of-3 times
and ratios (no asserts), and how many embeddings of the earlier way depended on their batch.
"""

from __future__ import annotations

import sys
import timeit

import numpy as np
import torch

from cglib.config import ModelParams
from cglib.encoding import _run_text_tower, encode_images, pixels_to_tensor, tokenize
from cglib.models import build_model
from cglib.run import seed_everything

WORDS = ["a", "red", "cube", "on", "the", "wooden", "table", "near", "small", "blue", "sphere", "under", "bright",
         "light", "in", "park", "with", "two", "dogs", "and", "yellow", "ball", "beside", "green", "chair", "of"]


def timed(fn, repeat: int = 3) -> float:
    """The best of `repeat` single calls."""
    return min(timeit.repeat(fn, number=1, repeat=repeat))


@torch.no_grad()
def earlier_texts(bundle, texts: list[str], batch_size: int = 256) -> np.ndarray:
    """The batching before fixed shapes: sorted by length, chunks of `batch_size`, each cut to its longest text."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out = np.empty((len(texts), bundle.embed_dim), dtype=np.float32)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        tokens = tokenize(bundle, [texts[i] for i in rows])
        out[rows] = bundle.model.encode_text(tokens, normalize=False).float().numpy()
    return out


@torch.no_grad()
def earlier_images(bundle, pixels: np.ndarray, batch_size: int = 256) -> np.ndarray:
    chunks = [bundle.model.encode_image(pixels_to_tensor(pixels[s:s + batch_size], bundle), normalize=True)
              for s in range(0, len(pixels), batch_size)]
    return torch.cat(chunks).numpy()


def main(n_texts: int = 1328, n_images: int = 206) -> None:
    seed_everything(0)
    bundle = build_model(ModelParams(name="cglib-demo-vit", text_tower="minilm"))
    bundle.model.eval()
    rng = np.random.default_rng(0)
    texts = list(dict.fromkeys(" ".join(rng.choice(WORDS, rng.integers(1, 16))) for _ in range(3 * n_texts)))
    texts = texts[:n_texts]
    pixels = rng.integers(0, 256, (n_images, 64, 64, 3), dtype=np.uint8)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {len(texts)} texts, {n_images} images")

    old_t, new_t = timed(lambda: earlier_texts(bundle, texts)), timed(lambda: _run_text_tower(bundle, texts, False))
    print(f"texts:  earlier {old_t:.2f} s, fixed shape {new_t:.2f} s, ratio {new_t / old_t:.2f}")
    old_i, new_i = timed(lambda: earlier_images(bundle, pixels)), timed(lambda: encode_images(bundle, pixels))
    print(f"images: earlier {old_i:.2f} s, fixed shape {new_i:.2f} s, ratio {new_i / old_i:.2f}")

    # the earlier way: each text's outputs in its own batch vs in the whole set (bitwise)
    sample = texts[:20]
    whole = earlier_texts(bundle, texts)[:20]
    alone = np.concatenate([earlier_texts(bundle, [t]) for t in sample])
    fixed_whole = _run_text_tower(bundle, texts, False)[:20]
    fixed_alone = np.concatenate([_run_text_tower(bundle, [t], False) for t in sample])
    print(f"earlier: {int((alone != whole).any(1).sum())} of 20 texts differ alone vs in the set "
          f"(max {float(np.abs(alone - whole).max()):.2e}); fixed shape: {int((fixed_alone != fixed_whole).any(1).sum())}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
