"""An embedding is bitwise a function of its item and the weights: not of the other items embedded with it, their
number or order, nor of what an earlier caller left in the MiniLM memo. (Before, the demo's metrics moved in the
fourth decimal when a notebook embedded other texts first.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cglib.config import ModelParams
from cglib.encoding import _MINILM_MEMO, TEXT_BATCH, encode_images, encode_texts
from cglib.evaluate.gallery import gallery_scores
from cglib.evaluate.items import TextField
from cglib.models import build_model
from cglib.run import seed_everything

TEXTS = ["a dog", "a dog on a sofa", "two red cars parked in the narrow street near a bakery", "x", "picnic",
         "a bowl of fruit on a wooden kitchen table", "sport", "meal", "a cat",
         "a very long caption about a birthday party with a cake, many balloons, a clown and children running"]
MORE = [f"filler caption number {k} about {'a long walk ' * (k % 4)}in the park" for k in range(TEXT_BATCH + 3)]


@pytest.fixture(scope="module")
def bundle():
    """The demo's text side (MiniLM with a projection) on the tiny ViT; the projection moved off the identity,
    as a trained one is (the identity would hide a row-count-dependent matmul)."""
    seed_everything(0)
    model = build_model(ModelParams(name="cglib-tiny-vit", text_tower="minilm", text_projection="identity"))
    with torch.no_grad():
        proj = model.text_projection().weight
        proj.add_(0.05 * torch.randn(proj.shape, generator=torch.Generator().manual_seed(1)))
    return model


def fresh(bundle, texts: list[str]) -> np.ndarray:
    """encode_texts with an empty memo (as a new process)."""
    _MINILM_MEMO.clear()
    return encode_texts(bundle, texts)


def test_text_embeddings_do_not_depend_on_the_other_texts(bundle):
    together = fresh(bundle, TEXTS)
    alone = np.stack([fresh(bundle, [t])[0] for t in TEXTS])
    reversed_ = fresh(bundle, TEXTS[::-1])[::-1]
    among_many = fresh(bundle, MORE[:40] + TEXTS + MORE[40:])[40:40 + len(TEXTS)]
    assert np.array_equal(alone, together)
    assert np.array_equal(reversed_, together)
    assert np.array_equal(among_many, together)


def test_the_memo_filled_by_an_earlier_caller_changes_nothing(bundle):
    """A first caller that embedded some of the texts among others (a base's caption table before evaluation)."""
    expected = fresh(bundle, TEXTS)
    _MINILM_MEMO.clear()
    encode_texts(bundle, MORE + TEXTS[::2])
    assert np.array_equal(encode_texts(bundle, TEXTS), expected)
    _MINILM_MEMO.clear()
    for text in TEXTS[1::2]:  # callers of one text at a time (the explorer's queries)
        encode_texts(bundle, [text])
    assert np.array_equal(encode_texts(bundle, TEXTS), expected)


def test_image_embeddings_do_not_depend_on_the_other_images(bundle):
    pixels = np.random.default_rng(0).integers(0, 256, (11, 40, 40, 3), dtype=np.uint8)
    together = encode_images(bundle, pixels, batch_size=8)
    alone = np.concatenate([encode_images(bundle, pixels[i:i + 1], batch_size=8) for i in range(len(pixels))])
    reversed_ = encode_images(bundle, pixels[::-1], batch_size=8)[::-1]
    assert np.array_equal(alone, together)
    assert np.array_equal(reversed_, together)


def test_a_gallery_metric_does_not_depend_on_how_its_items_were_batched(bundle):
    """The same gallery scored from embeddings computed all at once and one item at a time: equal to the bit."""
    queries = ["meal", "sport", "a cat"]
    field = TextField("l2", "dag", (("meal",), ("sport",), ("sport",), ("a cat",), ("meal",)), unit="query", level=2)
    pixels = np.random.default_rng(1).integers(0, 256, (5, 40, 40, 3), dtype=np.uint8)
    index = {t: i for i, t in enumerate(queries)}

    def scores(images: np.ndarray, texts: np.ndarray) -> dict:
        out = gallery_scores(field, images, texts, index, ks=[1, 2], group_ids=np.zeros(5, int))
        return {key: ms.scores.values.tolist() for key, ms in out.items()}

    at_once = scores(encode_images(bundle, pixels, batch_size=4), fresh(bundle, queries + MORE)[:3])
    one_by_one = scores(np.concatenate([encode_images(bundle, pixels[i:i + 1], batch_size=4) for i in range(5)]),
                        np.stack([fresh(bundle, [t])[0] for t in queries]))
    assert at_once == one_by_one
