"""cglib.radial (HierarCaps Radial Embedding loss) against a literal loop reference, plus its geometric properties."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from reference_losses import ref_exterior_angle, ref_radial_embedding_loss

from cglib.radial import exterior_angle, genericness, radial_embedding_loss


def make_inputs(b: int = 3, k: int = 4, dim: int = 6, seed: int = 0, dtype: torch.dtype = torch.float64,
                requires_grad: bool = False) -> dict[str, torch.Tensor]:
    """Random root (L,), positives/negatives and their frozen-tower copies (B, K, L), deliberately not unit."""
    gen = torch.Generator().manual_seed(seed)
    out = {"root": 2 * torch.randn(dim, generator=gen, dtype=dtype),
           "positives": 3 * torch.randn(b, k, dim, generator=gen, dtype=dtype),
           "negatives": 0.5 * torch.randn(b, k, dim, generator=gen, dtype=dtype)}
    out["frozen_positives"] = out["positives"] + 0.3 * torch.randn(b, k, dim, generator=gen, dtype=dtype)
    out["frozen_negatives"] = out["negatives"] + 0.3 * torch.randn(b, k, dim, generator=gen, dtype=dtype)
    for name in ("root", "positives", "negatives"):
        out[name].requires_grad_(requires_grad)
    return out


@pytest.mark.parametrize(("b", "k"), [(1, 2), (3, 4), (5, 5), (2, 7)])
@pytest.mark.parametrize("seed", [0, 1])
def test_equals_literal_reference(b: int, k: int, seed: int) -> None:
    """Loss, parts and gradients equal the float64 loops for several B and K (HierarCaps K=4, MAGIC K=5)."""
    x = make_inputs(b, k, seed=seed, requires_grad=True)
    weights = {"w_mean": 1.0, "w_minimax": 0.7, "w_reg": 10.0}
    got = radial_embedding_loss(**x, **weights, return_parts=True)
    want = ref_radial_embedding_loss(**x, **weights)
    assert set(got) == set(want)
    for key in want:
        torch.testing.assert_close(got[key], want[key], msg=key)
    leaves = (x["root"], x["positives"], x["negatives"])
    for g, w in zip(torch.autograd.grad(got["loss"], leaves), torch.autograd.grad(want["loss"], leaves),
                    strict=True):
        torch.testing.assert_close(g, w)
    assert radial_embedding_loss(**x, **weights).item() == pytest.approx(got["loss"].item())


def test_gradcheck() -> None:
    """Analytic gradients equal finite differences in float64 (random inputs: far from the arccos clamp)."""
    x = make_inputs(2, 3, dim=4, seed=3, requires_grad=True)

    def f(root: torch.Tensor, positives: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
        return radial_embedding_loss(root, positives, negatives, x["frozen_positives"], x["frozen_negatives"])

    assert torch.autograd.gradcheck(f, (x["root"], x["positives"], x["negatives"]))


def test_gradients_reach_root_positives_negatives_not_frozen() -> None:
    """The root carries gradient (it comes from the trained tower); frozen copies are detached."""
    x = make_inputs(requires_grad=True)
    x["frozen_positives"].requires_grad_(True)
    radial_embedding_loss(**x).backward()
    for name in ("root", "positives", "negatives"):
        assert x[name].grad is not None and x[name].grad.abs().sum() > 0, name
        assert torch.isfinite(x[name].grad).all(), name
    assert x["frozen_positives"].grad is None


def test_loss_falls_as_the_negative_leaves_the_cone() -> None:
    """On the sphere around a root at the north pole, P_2 straight outward from P_1: as N_1 turns away in
    azimuth, its exterior angle grows and the loss falls; N_1 = P_2 gives exactly 0."""

    def point(polar_deg: float, azimuth_deg: float) -> torch.Tensor:
        t, p = math.radians(polar_deg), math.radians(azimuth_deg)
        return torch.tensor([math.sin(t) * math.cos(p), math.sin(t) * math.sin(p), math.cos(t)],
                            dtype=torch.float64)

    root, p1, p2 = point(0, 0), point(30, 0), point(60, 0)
    losses = []
    for azimuth in (0, 30, 60, 90, 120, 150, 180):
        negatives = torch.stack([point(60, azimuth), point(90, 90)])[None]
        parts = radial_embedding_loss(root, torch.stack([p1, p2])[None], negatives, w_reg=0, return_parts=True)
        losses.append(parts["mean"].item())
        assert parts["minimax"].item() == pytest.approx(2 * parts["mean"].item())  # one triplet: picked twice
    assert losses[0] == pytest.approx(0, abs=1e-12)
    assert all(a > b for a, b in itertools.pairwise(losses))
    angle = exterior_angle(root, p1, p2).item()
    assert angle == pytest.approx(math.radians(30))  # chords of two 30-degree arcs turn by 30 degrees


def test_swapping_child_and_negative_flips_the_sign() -> None:
    """K = 2: exchanging P_2 and N_1 exchanges the two angles of every triplet, so the mean term flips sign."""
    x = make_inputs(b=4, k=2, seed=5)
    pos, neg = x["positives"], x["negatives"]
    swapped_pos = torch.stack([pos[:, 0], neg[:, 0]], dim=1)
    swapped_neg = torch.stack([pos[:, 1], neg[:, 1]], dim=1)
    a = radial_embedding_loss(x["root"], pos, neg, w_reg=0, return_parts=True)
    b = radial_embedding_loss(x["root"], swapped_pos, swapped_neg, w_reg=0, return_parts=True)
    torch.testing.assert_close(b["mean"], -a["mean"])
    torch.testing.assert_close(b["angle_pos"], a["angle_neg"])


def test_last_negative_enters_only_the_regularizer() -> None:
    """Triplets are (P_i, P_{i+1}, N_i) for i < K (PAPER_NOTES Sec. 5): N_K changes reg only."""
    x = make_inputs(seed=2)
    a = radial_embedding_loss(**x, return_parts=True)
    x["negatives"] = x["negatives"].clone()
    x["negatives"][:, -1] += 1.0
    b = radial_embedding_loss(**x, return_parts=True)
    for key in ("mean", "minimax", "angle_pos", "angle_neg"):
        torch.testing.assert_close(a[key], b[key])
    assert a["reg"].item() != pytest.approx(b["reg"].item())


def test_regularizer_and_weights() -> None:
    """reg = 0 when the texts equal their frozen copies (any scale), 1 when opposite; weights combine linearly."""
    x = make_inputs(seed=4)
    same = radial_embedding_loss(x["root"], x["positives"], x["negatives"], 2 * x["positives"],
                                 5 * x["negatives"], return_parts=True)
    assert same["reg"].item() == pytest.approx(0, abs=1e-12)
    opposite = radial_embedding_loss(x["root"], x["positives"], x["negatives"], -x["positives"],
                                     -x["negatives"], return_parts=True)
    assert opposite["reg"].item() == pytest.approx(1)
    p = radial_embedding_loss(**x, w_mean=0.5, w_minimax=2.0, w_reg=3.0, return_parts=True)
    torch.testing.assert_close(p["loss"], 0.5 * p["mean"] + 2.0 * p["minimax"] + 3.0 * p["reg"])
    no_reg = radial_embedding_loss(x["root"], x["positives"], x["negatives"], w_reg=0, return_parts=True)
    assert no_reg["reg"].item() == 0 and torch.equal(no_reg["mean"], p["mean"])


def test_zero_differences_are_finite() -> None:
    """A text embedded at the root, two identical consecutive texts and an all-zero embedding: finite loss and
    gradients; a zero direction counts as orthogonal (angle pi/2)."""
    x = make_inputs(b=2, k=4, seed=6)
    root = x["root"].clone().requires_grad_(True)
    positives, negatives = x["positives"].clone(), x["negatives"].clone()
    positives[0, 0] = 3 * x["root"]  # e - r = 0 after normalization
    positives[1, 2] = positives[1, 1]  # e' - e = 0
    negatives[1, 0] = 0.0  # normalizes to the zero vector
    positives.requires_grad_(True)
    negatives.requires_grad_(True)
    for dtype in (torch.float64, torch.float32):
        args = [t.to(dtype) for t in (root, positives, negatives, x["frozen_positives"], x["frozen_negatives"])]
        loss = radial_embedding_loss(*args)
        grads = torch.autograd.grad(loss, (root, positives, negatives))
        assert torch.isfinite(loss) and all(torch.isfinite(g).all() for g in grads), dtype
    r, p = root.detach(), positives[0, 1].detach()
    assert exterior_angle(r, r, p).item() == pytest.approx(math.pi / 2)  # exactly zero e - r
    assert exterior_angle(r, 3 * r, p).item() == pytest.approx(math.pi / 2, abs=1e-3)  # zero up to rounding
    assert torch.isfinite(exterior_angle(root.detach(), root.detach(), root.detach()))


def test_full_precision_under_autocast() -> None:
    """bfloat16 inputs under autocast give a float32 loss; float64 stays float64."""
    x = make_inputs(dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = radial_embedding_loss(**{k: v.to(torch.bfloat16) for k, v in x.items()})
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert radial_embedding_loss(**make_inputs()).dtype == torch.float64


def test_genericness() -> None:
    """d_r(e) = |e - r| of unit vectors, broadcast over leading axes; 0 at the root, 2 at its antipode."""
    x = make_inputs()
    d = genericness(x["root"], x["positives"])
    assert d.shape == x["positives"].shape[:2]
    r = x["root"] / x["root"].norm()
    torch.testing.assert_close(d[1, 2], (x["positives"][1, 2] / x["positives"][1, 2].norm() - r).norm())
    assert genericness(x["root"], 4 * x["root"]).item() == pytest.approx(0, abs=1e-12)
    assert genericness(x["root"], -x["root"]).item() == pytest.approx(2)
    with pytest.raises(ValueError, match="root has 6 dimensions but e has 5"):
        genericness(x["root"], torch.randn(5, dtype=torch.float64))


def test_exterior_angle_matches_reference() -> None:
    """The public exterior_angle, broadcast over items, equals the literal one."""
    x = make_inputs(seed=7)
    root, p = x["root"], x["positives"]
    got = exterior_angle(root, p[:, 0], p[:, 1])
    for item in range(p.shape[0]):
        want = ref_exterior_angle(root / root.norm(), p[item, 0] / p[item, 0].norm(), p[item, 1] / p[item, 1].norm())
        torch.testing.assert_close(got[item], want)


def test_argument_errors() -> None:
    """Wrong shapes, K < 2, a missing frozen copy, a bad weight or NaN raise errors that name the problem."""
    x = make_inputs()
    root, pos, neg = x["root"], x["positives"], x["negatives"]
    fp, fn = x["frozen_positives"], x["frozen_negatives"]
    cases = [
        ((root[None], pos, neg, fp, fn), {}, r"root must have shape \(L,\)"),
        ((root, pos[0], neg, fp, fn), {}, r"positives must have shape \(B items, K tiers, L\)"),
        ((root, pos, neg[:, :3], fp, fn), {}, "must have the same shape: one negative per tier"),
        ((root, pos[:, :1], neg[:, :1], fp[:, :1], fn[:, :1]), {}, "K = 1 tiers; the RE loss needs K >= 2"),
        ((root[:5], pos, neg, fp, fn), {}, "root has 5 dimensions but the texts have 6"),
        ((root, pos, neg), {}, "w_reg != 0 needs frozen_positives and frozen_negatives"),
        ((root, pos, neg, fp, fn[:2]), {}, r"frozen_negatives \(2, 4, 6\) must have the shape of positives"),
        ((root, pos, neg, fp, fn), {"w_minimax": float("nan")}, "w_minimax must be a finite number"),
        ((root, pos, neg, fp, fn), {"eps": 0}, r"eps must be in \(0, 1\)"),
        ((root, pos.long(), neg, fp, fn), {}, "positives must be a floating-point tensor"),
        ((root, pos, neg.masked_fill(torch.ones_like(neg, dtype=torch.bool), float("nan")), fp, fn), {},
         "negatives contains NaN or Inf"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            radial_embedding_loss(*args, **kwargs)
    with pytest.raises(TypeError, match="positives must be a torch.Tensor, got list"):
        radial_embedding_loss(root, pos.tolist(), neg, fp, fn)
