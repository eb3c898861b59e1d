"""cglib.losses against literal loop implementations of Eqs. 1-8, plus the properties the training relies on."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from reference_losses import (
    ref_centroid_inner,
    ref_centroid_loss,
    ref_centroid_outer,
    ref_clip_loss,
    ref_pairwise_inner,
    ref_pairwise_loss,
    ref_pairwise_outer,
)

from cglib.losses import (
    centroid_group_loss,
    clip_loss,
    gather_groups,
    pairwise_group_loss,
    text_alignment_loss,
)

TAU, TAU_INNER, ALPHA = 0.1, 0.2, 0.7


def make_features(m: int = 3, n: int = 4, dim: int = 6, seed: int = 0, dtype: torch.dtype = torch.float64,
                  requires_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Random (M, N, L) image and text features, deliberately not normalized."""
    gen = torch.Generator().manual_seed(seed)
    image = (3 * torch.randn(m, n, dim, generator=gen, dtype=dtype)).requires_grad_(requires_grad)
    text = (0.5 * torch.randn(m, n, dim, generator=gen, dtype=dtype)).requires_grad_(requires_grad)
    return image, text


def grads(loss: torch.Tensor, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return torch.autograd.grad(loss, inputs)


# --------------------------------------------------------------------------------- literal equations
@pytest.mark.parametrize("normalize_products", [False, True])
@pytest.mark.parametrize("alpha_on", ["inner", "outer"])
@pytest.mark.parametrize(("m", "n"), [(3, 4), (4, 3)])  # M < N and M >= N take different contraction orders
def test_pairwise_equals_literal_equations(alpha_on: str, normalize_products: bool, m: int, n: int) -> None:
    """Pairwise loss, its inner (Eq. 3) and outer (Eq. 2) parts and their gradients equal the float64 loops,
    for the paper's Eq. 1 centroid and the authors' normalized-product variant, alpha on either term."""
    image, text = make_features(m=m, n=n, requires_grad=True)
    parts = pairwise_group_loss(image, text, TAU, TAU_INNER, ALPHA, alpha_on=alpha_on,
                                normalize_products=normalize_products, return_parts=True)
    expected = ref_pairwise_loss(image, text, TAU, TAU_INNER, ALPHA, alpha_on, normalize_products)
    torch.testing.assert_close(parts["inner"], ref_pairwise_inner(image, text, TAU_INNER, normalize_products))
    torch.testing.assert_close(parts["outer"], ref_pairwise_outer(image, text, TAU))
    torch.testing.assert_close(parts["loss"], expected)
    for got, want in zip(grads(parts["loss"], image, text), grads(expected, image, text), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("alpha_on", ["inner", "outer"])
def test_centroid_equals_literal_equations(alpha_on: str) -> None:
    """Centroid loss, its inner (Eq. 7) and outer (Eq. 6) parts and their gradients equal the float64 loops."""
    image, text = make_features(requires_grad=True)
    parts = centroid_group_loss(image, text, TAU, TAU_INNER, ALPHA, alpha_on=alpha_on, return_parts=True)
    expected = ref_centroid_loss(image, text, TAU, TAU_INNER, ALPHA, alpha_on)
    torch.testing.assert_close(parts["inner"], ref_centroid_inner(image, text, TAU_INNER))
    torch.testing.assert_close(parts["outer"], ref_centroid_outer(image, text, TAU))
    torch.testing.assert_close(parts["loss"], expected)
    for got, want in zip(grads(parts["loss"], image, text), grads(expected, image, text), strict=True):
        torch.testing.assert_close(got, want)


def test_alpha_weighting_conventions() -> None:
    """alpha_on='inner' is alpha*inner + (1-alpha)*outer (paper); 'outer' is alpha*outer + (1-alpha)*inner
    (authors' code, whose alpha=1.2233 lies outside [0, 1] and is accepted); return_parts does not change loss."""
    image, text = make_features()
    for loss_fn in (pairwise_group_loss, centroid_group_loss):
        p = loss_fn(image, text, TAU, TAU_INNER, 0.3, return_parts=True)
        torch.testing.assert_close(p["loss"], 0.3 * p["inner"] + 0.7 * p["outer"])
        torch.testing.assert_close(loss_fn(image, text, TAU, TAU_INNER, 0.3), p["loss"])
        q = loss_fn(image, text, TAU, TAU_INNER, 1.2233, alpha_on="outer", return_parts=True)
        torch.testing.assert_close(q["loss"], 1.2233 * q["outer"] + (1 - 1.2233) * q["inner"])


def test_authors_pairwise_inner_differs_from_paper() -> None:
    """normalize_products changes only the pairwise inner term (the centroid), so the option is not a no-op."""
    image, text = make_features()
    paper = pairwise_group_loss(image, text, return_parts=True)
    authors = pairwise_group_loss(image, text, normalize_products=True, return_parts=True)
    torch.testing.assert_close(paper["outer"], authors["outer"])
    assert abs(paper["inner"].item() - authors["inner"].item()) > 1e-4


def test_clip_loss_equals_literal_infonce() -> None:
    """clip_loss equals the loop InfoNCE over all M*N pairs, and (M, N, L) input equals its (M*N, L) reshape."""
    image, text = make_features()
    expected = ref_clip_loss(image.reshape(-1, 6), text.reshape(-1, 6), TAU)
    torch.testing.assert_close(clip_loss(image, text, TAU), expected)
    torch.testing.assert_close(clip_loss(image.reshape(-1, 6), text.reshape(-1, 6), TAU), expected)


def test_text_alignment_loss_is_text_text_infonce() -> None:
    """text_alignment_loss(a, b) equals the loop InfoNCE with row b of each text set the positive of the other."""
    a, b = make_features(m=1, n=7)
    torch.testing.assert_close(text_alignment_loss(a[0], b[0], 0.05), ref_clip_loss(a[0], b[0], 0.05))


def test_centroid_outer_with_one_pair_per_group_is_clip() -> None:
    """With N = 1 each centroid is its only feature, so the centroid outer loss (Eq. 6) is CLIP's InfoNCE."""
    image, text = make_features(m=5, n=1)
    outer = centroid_group_loss(image, text, TAU, return_parts=True)["outer"]
    torch.testing.assert_close(outer, clip_loss(image, text, TAU))


# ------------------------------------------------------------------------------------------ gradients
@pytest.mark.parametrize("name", ["pairwise", "pairwise_normalized", "centroid", "clip", "text"])
@pytest.mark.parametrize(("m", "n"), [(3, 2), (2, 3)])
def test_gradcheck_float64(name: str, m: int, n: int) -> None:
    """Analytic gradients w.r.t. both feature tensors and a learned temperature match finite differences."""
    image, text = make_features(m=m, n=n, dim=4, requires_grad=True)
    tau = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    fns = {
        "pairwise": lambda i, t, s: pairwise_group_loss(i, t, s, s * 2, ALPHA),
        "pairwise_normalized": lambda i, t, s: pairwise_group_loss(i, t, s, 0.4, ALPHA, normalize_products=True),
        "centroid": lambda i, t, s: centroid_group_loss(i, t, s, s, ALPHA),
        "clip": lambda i, t, s: clip_loss(i, t, s),
        "text": lambda i, t, s: text_alignment_loss(i.reshape(-1, 4), t.reshape(-1, 4), s),
    }
    assert torch.autograd.gradcheck(fns[name], (image, text, tau))


# ------------------------------------------------------------------------------------------ invariances
ALL_LOSSES = {
    "pairwise": lambda i, t: pairwise_group_loss(i, t, TAU, TAU_INNER, ALPHA),
    "pairwise_normalized": lambda i, t: pairwise_group_loss(i, t, TAU, TAU_INNER, ALPHA, normalize_products=True),
    "centroid": lambda i, t: centroid_group_loss(i, t, TAU, TAU_INNER, ALPHA),
    "clip": lambda i, t: clip_loss(i, t, TAU),
}
GROUP_LOSSES = {k: v for k, v in ALL_LOSSES.items() if k != "clip"}


@pytest.mark.parametrize("name", list(ALL_LOSSES))
def test_invariant_to_feature_scale(name: str) -> None:
    """Rescaling each feature vector by any positive factor (1e-30 to 1e30, float32) leaves the loss unchanged."""
    image, text = make_features(dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    exponents = torch.randint(-30, 31, (2, 3, 4, 1), generator=gen).float()
    scaled_image, scaled_text = image * 10.0 ** exponents[0], text * 10.0 ** exponents[1]
    loss = ALL_LOSSES[name]
    torch.testing.assert_close(loss(scaled_image, scaled_text), loss(image, text), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(ALL_LOSSES))
def test_equivariant_to_permuting_groups(name: str) -> None:
    """Reordering the groups (same order for images and texts) keeps the loss and permutes the gradient."""
    image, text = make_features(m=4, requires_grad=True)
    perm = torch.tensor([2, 0, 3, 1])
    loss = ALL_LOSSES[name]
    base, permuted = loss(image, text), loss(image[perm], text[perm])
    torch.testing.assert_close(permuted, base)
    for g_perm, g_base in zip(grads(permuted, image, text), grads(base, image, text), strict=True):
        torch.testing.assert_close(g_perm, g_base)  # both are d/d(original tensors): the same map


@pytest.mark.parametrize("name", list(GROUP_LOSSES))
def test_group_losses_depend_only_on_group_membership(name: str) -> None:
    """Permuting images and texts inside each group, even independently, changes no group loss (Eqs. 2-7 sum
    over all pairs of a group); with the same permutation for both, CLIP is unchanged too (tested below)."""
    image, text = make_features(m=3, n=5)
    gen = torch.Generator().manual_seed(2)
    perm_i = torch.stack([torch.randperm(5, generator=gen) for _ in range(3)])
    perm_t = torch.stack([torch.randperm(5, generator=gen) for _ in range(3)])
    shuffled_i = torch.gather(image, 1, perm_i[..., None].expand_as(image))
    shuffled_t = torch.gather(text, 1, perm_t[..., None].expand_as(text))
    torch.testing.assert_close(GROUP_LOSSES[name](shuffled_i, shuffled_t), GROUP_LOSSES[name](image, text))


def test_clip_invariant_to_permuting_pairs_jointly() -> None:
    """CLIP loss is unchanged when pairs are reordered inside groups with the same order for images and texts."""
    image, text = make_features(m=3, n=5)
    perm = torch.tensor([4, 2, 0, 1, 3])
    torch.testing.assert_close(clip_loss(image[:, perm], text[:, perm]), clip_loss(image, text))


# ------------------------------------------------------------------------------------------- numerics
@pytest.mark.parametrize("tau", [0.01, 10.0])
@pytest.mark.parametrize("tau_inner", [0.01, 10.0])
@pytest.mark.parametrize("aligned", [False, True])
def test_finite_at_temperature_extremes(tau: float, tau_inner: float, aligned: bool) -> None:
    """Loss and gradients stay finite in float32 for tau, tau' in {0.01, 10}, random or perfectly aligned pairs."""
    image, text = make_features(m=4, n=3, dim=8, dtype=torch.float32)
    if aligned:
        text = image.clone()
    image.requires_grad_()
    text.requires_grad_()
    values = [pairwise_group_loss(image, text, tau, tau_inner, ALPHA),
              pairwise_group_loss(image, text, tau, tau_inner, ALPHA, normalize_products=True),
              centroid_group_loss(image, text, tau, tau_inner, ALPHA), clip_loss(image, text, tau)]
    for value in values:
        assert torch.isfinite(value)
        assert all(torch.isfinite(g).all() for g in grads(value, image, text))


def test_zero_feature_vector_is_finite() -> None:
    """A zero feature vector normalizes to zero (F.normalize eps): loss and gradients stay finite."""
    image, text = make_features(dtype=torch.float32)
    image[0, 0] = 0.0
    text[1, 2] = 0.0
    image.requires_grad_()
    text.requires_grad_()
    for loss in ALL_LOSSES.values():
        value = loss(image, text)
        assert torch.isfinite(value)
        assert all(torch.isfinite(g).all() for g in grads(value, image, text))


def test_bf16_autocast_computes_in_float32() -> None:
    """Features produced under bf16 autocast give a float32 loss, equal to the loss of those bf16 features cast to
    float32, and within bf16 rounding of the loss of the float32 features."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 16, generator=gen)
    proj_i, proj_t = torch.nn.Linear(16, 8), torch.nn.Linear(16, 8)
    for name, loss in ALL_LOSSES.items():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            image, text = proj_i(x), proj_t(x)
            assert image.dtype == torch.bfloat16
            value = loss(image, text)
        assert value.dtype == torch.float32, name
        torch.testing.assert_close(value, loss(image.float(), text.float()))
        torch.testing.assert_close(value, loss(proj_i(x), proj_t(x)), rtol=3e-2, atol=3e-2)


def test_mixed_precision_inputs_promote() -> None:
    """bf16 images with float32 texts (or float64) are computed in the wider dtype, at least float32."""
    image, text = make_features(dtype=torch.float32)
    assert pairwise_group_loss(image.bfloat16(), text).dtype == torch.float32
    assert centroid_group_loss(image, text.double()).dtype == torch.float64
    torch.testing.assert_close(clip_loss(image.half(), text), clip_loss(image.half().float(), text))


def test_learned_temperature_tensor() -> None:
    """tau given as a 0-dim tensor gives the same loss as the float and a finite gradient for it."""
    image, text = make_features()
    tau = torch.tensor(TAU, dtype=torch.float64, requires_grad=True)
    for loss_fn in (pairwise_group_loss, centroid_group_loss):
        value = loss_fn(image, text, tau, tau, ALPHA)
        torch.testing.assert_close(value, loss_fn(image, text, TAU, TAU, ALPHA))
        (g,) = torch.autograd.grad(value, tau)
        assert torch.isfinite(g) and g != 0


def test_single_group_has_nothing_to_contrast() -> None:
    """M = 1 is allowed: every group term (a cross-entropy over one class) and the pairwise outer term are 0."""
    image, text = make_features(m=1)
    for loss_fn in (pairwise_group_loss, centroid_group_loss):
        parts = loss_fn(image, text, return_parts=True)
        for key in ("loss", "inner", "outer"):
            torch.testing.assert_close(parts[key], torch.zeros((), dtype=torch.float64), atol=1e-12, rtol=0)


def test_gather_groups_is_identity_without_distributed() -> None:
    """Outside torch.distributed, gather_groups returns the local features unchanged."""
    image, _ = make_features()
    assert gather_groups(image) is image


# ------------------------------------------------------------------------------- identical texts (text_ids)
# (M=3, N=4) ids: a duplicate inside group 0 (id 1), a text shared by groups 0 and 1 (id 0)...
SHARED_TEXT_IDS = torch.tensor([[0, 1, 1, 2], [3, 0, 4, 5], [6, 7, 8, 9]])
# ... and groups 0 and 1 holding the same multiset of texts (in another order), group 2 sharing one of them
SAME_GROUP_IDS = torch.tensor([[0, 1, 2, 2], [2, 1, 0, 2], [5, 6, 2, 7]])
IDS_CASES = {"shared_text": SHARED_TEXT_IDS, "same_group": SAME_GROUP_IDS}

LOSSES_WITH_IDS = {
    "pairwise": lambda i, t, ids: pairwise_group_loss(i, t, TAU, TAU_INNER, ALPHA, text_ids=ids),
    "pairwise_normalized": lambda i, t, ids: pairwise_group_loss(i, t, TAU, TAU_INNER, ALPHA,
                                                                 normalize_products=True, text_ids=ids),
    "centroid": lambda i, t, ids: centroid_group_loss(i, t, TAU, TAU_INNER, ALPHA, text_ids=ids),
    "clip": lambda i, t, ids: clip_loss(i, t, TAU, text_ids=ids),
    "text": lambda i, t, ids: text_alignment_loss(i.reshape(-1, i.shape[-1]), t.reshape(-1, t.shape[-1]), TAU,
                                                  text_ids=None if ids is None else ids.reshape(-1)),
}


@pytest.mark.parametrize("name", list(LOSSES_WITH_IDS))
def test_distinct_ids_give_exactly_the_unmasked_loss(name: str) -> None:
    """text_ids=None and all-distinct ids give bit-identical losses and gradients (nothing else changes)."""
    image, text = make_features(requires_grad=True)
    loss = LOSSES_WITH_IDS[name]
    plain, distinct = loss(image, text, None), loss(image, text, torch.arange(12).reshape(3, 4) * 7 - 20)
    assert torch.equal(plain, distinct)
    for got, want in zip(grads(distinct, image, text), grads(plain, image, text), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("case", list(IDS_CASES))
@pytest.mark.parametrize("normalize_products", [False, True])
@pytest.mark.parametrize("alpha_on", ["inner", "outer"])
def test_masked_pairwise_equals_literal_rule(case: str, normalize_products: bool, alpha_on: str) -> None:
    """With duplicate ids the pairwise loss, its parts and gradients equal the loops that skip those negatives."""
    image, text = make_features(requires_grad=True)
    ids = IDS_CASES[case]
    parts = pairwise_group_loss(image, text, TAU, TAU_INNER, ALPHA, alpha_on=alpha_on,
                                normalize_products=normalize_products, return_parts=True, text_ids=ids)
    torch.testing.assert_close(parts["inner"], ref_pairwise_inner(image, text, TAU_INNER, normalize_products, ids))
    torch.testing.assert_close(parts["outer"], ref_pairwise_outer(image, text, TAU, ids))
    expected = ref_pairwise_loss(image, text, TAU, TAU_INNER, ALPHA, alpha_on, normalize_products, ids)
    for got, want in zip(grads(parts["loss"], image, text), grads(expected, image, text), strict=True):
        torch.testing.assert_close(got, want)
    assert parts["outer"] < pairwise_group_loss(image, text, TAU, return_parts=True)["outer"]  # fewer negatives


@pytest.mark.parametrize("case", list(IDS_CASES))
def test_masked_centroid_equals_literal_rule(case: str) -> None:
    """Centroid loss with ids: only groups holding the same multiset of texts leave each other's denominators."""
    image, text = make_features(requires_grad=True)
    ids = IDS_CASES[case]
    parts = centroid_group_loss(image, text, TAU, TAU_INNER, ALPHA, return_parts=True, text_ids=ids)
    torch.testing.assert_close(parts["inner"], ref_centroid_inner(image, text, TAU_INNER, ids))
    torch.testing.assert_close(parts["outer"], ref_centroid_outer(image, text, TAU, ids))
    expected = ref_centroid_loss(image, text, TAU, TAU_INNER, ALPHA, ids=ids)
    for got, want in zip(grads(parts["loss"], image, text), grads(expected, image, text), strict=True):
        torch.testing.assert_close(got, want)
    unmasked = centroid_group_loss(image, text, TAU, TAU_INNER, ALPHA, return_parts=True)
    if case == "shared_text":  # a shared caption between different groups does not make them the same group
        torch.testing.assert_close(parts["loss"], unmasked["loss"], rtol=0, atol=0)
    else:
        assert parts["loss"] < unmasked["loss"]


@pytest.mark.parametrize("case", list(IDS_CASES))
def test_masked_clip_and_text_alignment_equal_literal_rule(case: str) -> None:
    """clip_loss ((M, N) ids) and text_alignment_loss ((B,) ids) equal the loops skipping identical texts."""
    image, text = make_features(requires_grad=True)
    ids = IDS_CASES[case]
    flat_i, flat_t, flat_ids = image.reshape(-1, 6), text.reshape(-1, 6), ids.reshape(-1)
    expected = ref_clip_loss(flat_i, flat_t, TAU, flat_ids)
    got = clip_loss(image, text, TAU, text_ids=ids)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(clip_loss(flat_i, flat_t, TAU, text_ids=flat_ids), expected)
    for g, w in zip(grads(got, image, text), grads(expected, image, text), strict=True):
        torch.testing.assert_close(g, w)
    torch.testing.assert_close(text_alignment_loss(flat_i, flat_t, 0.05, text_ids=flat_ids),
                               ref_clip_loss(flat_i, flat_t, 0.05, flat_ids))


def test_duplicates_inside_one_group_change_no_group_loss() -> None:
    """A text repeated inside its own group is a positive either way: group losses are exactly unchanged."""
    image, text = make_features()
    ids = torch.tensor([[0, 0, 1, 1], [2, 2, 2, 3], [4, 5, 6, 7]])
    for name in ("pairwise", "pairwise_normalized", "centroid"):
        loss = LOSSES_WITH_IDS[name]
        assert torch.equal(loss(image, text, ids), loss(image, text, None)), name


def test_clip_loss_equals_open_clip_clip_loss() -> None:
    """clip_loss is open_clip's ClipLoss (logit_scale = 1/tau) when no two texts are identical, with or without ids;
    with identical texts it is the masked loss, which ClipLoss does not implement (it lies above)."""
    from open_clip.loss import ClipLoss

    image, text = make_features(m=4, n=5, dim=8)
    flat_i, flat_t = image.reshape(-1, 8), text.reshape(-1, 8)
    reference = ClipLoss()(F.normalize(flat_i, dim=-1), F.normalize(flat_t, dim=-1), logit_scale=1 / TAU)
    torch.testing.assert_close(clip_loss(image, text, TAU), reference)
    torch.testing.assert_close(clip_loss(image, text, TAU, text_ids=torch.arange(20).reshape(4, 5)), reference)
    ids = torch.arange(20).reshape(4, 5)
    ids[3, 4] = ids[0, 0]
    same_text = text.clone()
    same_text[3, 4] = same_text[0, 0]  # the caption of pair (0, 0) again
    flat_same = F.normalize(same_text.reshape(-1, 8), dim=-1)
    assert clip_loss(image, same_text, TAU, text_ids=ids) < ClipLoss()(F.normalize(flat_i, dim=-1), flat_same,
                                                                       logit_scale=1 / TAU)


def test_identical_captions_put_a_floor_of_ln2_on_unmasked_clip() -> None:
    """Two pairs sharing one caption: unmasked, the CLIP loss cannot go below ln 2 whatever the images (the shared
    caption is a positive and a negative at once); masked, perfectly matching images reach 0."""
    caption = torch.tensor([[1.0, 0.0, 0.0]])
    texts = caption.repeat(2, 1)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        images = torch.randn(2, 3, generator=gen, dtype=torch.float64)
        assert clip_loss(images, texts.double(), 0.01) >= math.log(2) - 1e-12
    same = torch.tensor([0, 0])
    torch.testing.assert_close(clip_loss(texts.clone(), texts, 0.01), torch.tensor(math.log(2)))
    torch.testing.assert_close(clip_loss(texts.clone(), texts, 0.01, text_ids=same), torch.tensor(0.0))


@pytest.mark.parametrize("name", list(LOSSES_WITH_IDS))
def test_gradcheck_masked(name: str) -> None:
    """Analytic gradients on the masked path (duplicates within and across groups, a repeated group) match finite
    differences, for the features and a learned temperature."""
    image, text = make_features(m=3, n=2, dim=4, requires_grad=True)
    tau = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[0, 1], [1, 0], [2, 0]])  # groups 0 and 1 hold the same texts; text 0 is in every group
    fns = {
        "pairwise": lambda i, t, s: pairwise_group_loss(i, t, s, s * 2, ALPHA, text_ids=ids),
        "pairwise_normalized": lambda i, t, s: pairwise_group_loss(i, t, s, 0.4, ALPHA, normalize_products=True,
                                                                   text_ids=ids),
        "centroid": lambda i, t, s: centroid_group_loss(i, t, s, s, ALPHA, text_ids=ids),
        "clip": lambda i, t, s: clip_loss(i, t, s, text_ids=ids),
        "text": lambda i, t, s: text_alignment_loss(i.reshape(-1, 4), t.reshape(-1, 4), s, text_ids=ids.reshape(-1)),
    }
    assert torch.autograd.gradcheck(fns[name], (image, text, tau))


@pytest.mark.parametrize("name", list(LOSSES_WITH_IDS))
def test_masked_losses_equivariant_to_permuting_groups(name: str) -> None:
    """Reordering groups together with their ids keeps every masked loss."""
    image, text = make_features()
    perm = torch.tensor([2, 0, 1])
    loss = LOSSES_WITH_IDS[name]
    for ids in IDS_CASES.values():
        torch.testing.assert_close(loss(image[perm], text[perm], ids[perm]), loss(image, text, ids))


# ----------------------------------------------------------------------------------------- bad input
BAD_INPUTS = [
    (lambda: pairwise_group_loss(torch.randn(4, 8), torch.randn(4, 8)), "shape \\(M groups, N pairs, L\\)"),
    (lambda: centroid_group_loss(torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)), "got \\(2, 3, 4, 5\\)"),
    (lambda: pairwise_group_loss(torch.randn(2, 3, 4), torch.randn(2, 4, 4)), "same shape"),
    (lambda: centroid_group_loss(torch.randn(0, 3, 4), torch.randn(0, 3, 4)), "empty dimension"),
    (lambda: pairwise_group_loss(torch.randn(2, 0, 4), torch.randn(2, 0, 4)), "empty dimension"),
    (lambda: clip_loss(torch.randn(2, 3, 0), torch.randn(2, 3, 0)), "empty dimension"),
    (lambda: centroid_group_loss(torch.full((2, 3, 4), float("nan")), torch.randn(2, 3, 4)),
     "image_features contains NaN or Inf"),
    (lambda: pairwise_group_loss(torch.randn(2, 3, 4), torch.full((2, 3, 4), float("inf"))),
     "text_features contains NaN or Inf"),
    (lambda: clip_loss(torch.ones(2, 3, 4, dtype=torch.long), torch.ones(2, 3, 4, dtype=torch.long)),
     "floating-point"),
    (lambda: clip_loss(torch.randn(3), torch.randn(3)), "shape \\(B, L\\) or"),
    (lambda: text_alignment_loss(torch.randn(2, 3, 4), torch.randn(2, 3, 4)), "text_a must have shape \\(B, L\\)"),
    (lambda: text_alignment_loss(torch.randn(3, 4), torch.randn(2, 4)), "text_a .* and text_b"),
    (lambda: pairwise_group_loss(torch.randn(2, 3, 4), torch.randn(2, 3, 4), tau=0.0), "tau must be a positive"),
    (lambda: centroid_group_loss(torch.randn(2, 3, 4), torch.randn(2, 3, 4), tau_inner=-1.0),
     "tau_inner must be a positive"),
    (lambda: clip_loss(torch.randn(2, 4), torch.randn(2, 4), tau=torch.ones(2)), "0-dim tensor"),
    (lambda: pairwise_group_loss(torch.randn(2, 3, 4), torch.randn(2, 3, 4), alpha_on="both"), "alpha_on"),
    (lambda: centroid_group_loss(torch.randn(2, 3, 4), torch.randn(2, 3, 4), alpha=float("nan")), "alpha must"),
    (lambda: pairwise_group_loss(torch.randn(2, 3, 4), torch.randn(2, 3, 4), text_ids=torch.zeros(6, dtype=torch.long)),
     "text_ids has shape \\(6,\\) .* needs \\(2, 3\\)"),
    (lambda: clip_loss(torch.randn(6, 4), torch.randn(6, 4), text_ids=torch.zeros(6)), "integer labels"),
    (lambda: text_alignment_loss(torch.randn(3, 4), torch.randn(3, 4), text_ids=torch.zeros(2, dtype=torch.long)),
     "text_ids has shape \\(2,\\) but text_b"),
]


@pytest.mark.parametrize(("call", "message"), BAD_INPUTS)
def test_bad_input_raises_value_error_naming_the_problem(call, message: str) -> None:
    """Malformed features or hyper-parameters raise ValueError whose message names the problem."""
    with pytest.raises(ValueError, match=message):
        call()


# ------------------------------------------------------------------- notebook helpers (cglib.viz)
@pytest.mark.slow
def test_dual_effect_group_losses_tighten_and_separate_groups() -> None:
    """Optimizing points with a group loss shrinks within-group spread and raises separation (paper Fig. 2); CLIP
    instead aligns each image with its own text and scatters the groups."""
    from cglib.viz.dual_effect import LOSS_NAMES, geometry_table, optimize_points

    table = geometry_table([optimize_points(name, seed=0) for name in LOSS_NAMES])
    for name in ("pairwise", "centroid"):
        row = table.loc[name]
        assert row.within_group_spread_after < 0.8 * row.within_group_spread_before
        assert row.separation_after > 2 * row.separation_before
    clip = table.loc["clip"]
    assert clip.pair_cosine_after > 0.95
    assert clip.within_group_spread_after > clip.within_group_spread_before
    assert table.loc["centroid"].separation_after > 2 * clip.separation_after


def test_group_geometry_of_known_configuration() -> None:
    """Two groups collapsed on opposite poles: spread 0, distance between group means 2, pair cosine 1."""
    import numpy as np

    from cglib.viz.dual_effect import group_geometry

    points = np.zeros((2, 3, 3))
    points[0, :, 2], points[1, :, 2] = 1.0, -1.0
    geometry = group_geometry(points, points.copy())
    assert geometry["within_group_spread"] == pytest.approx(0.0)
    assert geometry["centroid_distance"] == pytest.approx(2.0)
    assert geometry["pair_cosine"] == pytest.approx(1.0)


def test_equal_area_map_landmarks() -> None:
    """The map sends +z to the centre, the equator to radius sqrt(2) and points near -z towards radius 2."""
    import numpy as np

    from cglib.viz.dual_effect import equal_area_map

    points = np.array([[0, 0, 1.0], [1.0, 0, 0], [0, np.sin(0.01), -np.cos(0.01)]])
    radii = np.linalg.norm(equal_area_map(points), axis=-1)
    np.testing.assert_allclose(radii, [0.0, np.sqrt(2.0), 2.0], atol=1e-4)


def test_loss_variants_table_matches_direct_calls() -> None:
    """The variants table holds clip, 4 pairwise and 2 centroid rows whose values equal the direct calls."""
    from cglib.viz.dual_effect import group_batch, loss_variants_table

    image, text = group_batch(2, 5, 8, noise=2.0, seed=0)
    table = loss_variants_table(image, text, TAU, TAU_INNER, ALPHA)
    assert table["loss"].tolist() == ["clip"] + ["pairwise"] * 4 + ["centroid"] * 2
    authors = table.iloc[4]
    assert (authors["alpha_on"], authors["normalize_products"]) == ("outer", True)
    direct = pairwise_group_loss(image, text, TAU, TAU_INNER, ALPHA, alpha_on="outer", normalize_products=True)
    assert authors["loss_value"] == pytest.approx(direct.item())
    assert table.loc[table["loss"] == "clip", "loss_value"].item() == pytest.approx(clip_loss(image, text, TAU).item())


def test_plot_and_save_figure(tmp_path) -> None:
    """plot_dual_effect draws start + one panel per loss; save_figure writes non-empty PNG and PDF files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cglib.viz.dual_effect import optimize_points, plot_dual_effect
    from cglib.viz.style import apply_style, save_figure

    apply_style()
    fig = plot_dual_effect([optimize_points("centroid", steps=5), optimize_points("clip", steps=5)])
    assert len(fig.axes) == 3
    paths = save_figure(fig, tmp_path / "figures", "dual")
    plt.close(fig)
    assert [p.name for p in paths] == ["dual.png", "dual.pdf"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths[1].read_bytes()[:5] == b"%PDF-"
    with pytest.raises(ValueError, match="at least one"):
        plot_dual_effect([])


def test_style_palette_and_save_figure_errors(tmp_path) -> None:
    """apply_style sets the colour-blind palette; save_figure rejects stems with folders and unknown formats."""
    import matplotlib
    import matplotlib.pyplot as plt
    import seaborn as sns

    from cglib.viz.style import apply_style, save_figure

    apply_style()
    cycle = [matplotlib.colors.to_hex(c) for c in plt.rcParams["axes.prop_cycle"].by_key()["color"]]
    assert cycle == sns.color_palette("colorblind").as_hex()
    fig = plt.figure()
    with pytest.raises(ValueError, match="bare file name"):
        save_figure(fig, tmp_path, "sub/dual")
    with pytest.raises(ValueError, match="formats must be"):
        save_figure(fig, tmp_path, "dual", formats=("jpg",))
    plt.close(fig)
