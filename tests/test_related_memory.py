"""The momentum concept memory (cglib/train/objectives/concept_memory.py) and the memory centroid loss (DCCL-style, Eqs. 5-8 over G)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from reference_losses import ref_memory_centroid_loss

from cglib.config import TrainRunParams
from cglib.losses import centroid_group_loss, memory_centroid_loss
from cglib.train.objectives.concept_memory import ConceptMemory, group_centroids

TAU, TAU_INNER, ALPHA = 0.1, 0.2, 0.7


def make_case(m: int = 3, n: int = 4, g: int = 7, dim: int = 6, seed: int = 0, requires_grad: bool = False):
    """Random unnormalized (M, N, L) features, a (G, L) memory pair and M distinct rows, float64."""
    gen = torch.Generator().manual_seed(seed)
    image = (3 * torch.randn(m, n, dim, generator=gen, dtype=torch.float64)).requires_grad_(requires_grad)
    text = (0.5 * torch.randn(m, n, dim, generator=gen, dtype=torch.float64)).requires_grad_(requires_grad)
    mem_image = F.normalize(torch.randn(g, dim, generator=gen, dtype=torch.float64), dim=-1)
    mem_text = F.normalize(torch.randn(g, dim, generator=gen, dtype=torch.float64), dim=-1)
    index = torch.randperm(g, generator=gen)[:m]
    return image, text, mem_image, mem_text, index


def live_centroids(features: torch.Tensor) -> torch.Tensor:
    return F.normalize(F.normalize(features, dim=-1).mean(dim=1), dim=-1)


@pytest.mark.parametrize("alpha_on", ["inner", "outer"])
def test_memory_loss_equals_literal_loop(alpha_on: str) -> None:
    """Loss, and its gradients w.r.t. the features, equal the float64 loop reference over all G concepts."""
    image, text, mem_image, mem_text, index = make_case(requires_grad=True)
    got = memory_centroid_loss(image, text, mem_image, mem_text, index, TAU, TAU_INNER, ALPHA, alpha_on=alpha_on)
    want = ref_memory_centroid_loss(image, text, mem_image, mem_text, index.tolist(), TAU, TAU_INNER, ALPHA,
                                    alpha_on)
    torch.testing.assert_close(got, want)
    for a, b in zip(torch.autograd.grad(got, (image, text)), torch.autograd.grad(want, (image, text)), strict=True):
        torch.testing.assert_close(a, b)


def test_memory_loss_masks_batch_groups_with_the_same_texts() -> None:
    """With text ids, two batch groups holding the same texts leave each other's denominators, as the loop does."""
    image, text, mem_image, mem_text, index = make_case(m=3, n=2)
    ids = torch.tensor([[0, 1], [1, 0], [2, 3]])  # groups 0 and 1: the same multiset
    got = memory_centroid_loss(image, text, mem_image, mem_text, index, TAU, TAU_INNER, ALPHA, text_ids=ids)
    want = ref_memory_centroid_loss(image, text, mem_image, mem_text, index.tolist(), TAU, TAU_INNER, ALPHA,
                                    ids=ids)
    unmasked = memory_centroid_loss(image, text, mem_image, mem_text, index, TAU, TAU_INNER, ALPHA)
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, unmasked)


def test_memory_of_exactly_the_batch_equals_centroid_loss() -> None:
    """G = M and a memory holding the live centroids (in any row order) give centroid_group_loss, parts and all."""
    image, text, _, _, _ = make_case(m=4, n=3)
    ids = torch.tensor([[0, 1, 2], [2, 1, 0], [3, 4, 5], [6, 7, 8]])
    index = torch.tensor([2, 0, 3, 1])
    mem_image = torch.empty(4, 6, dtype=torch.float64)
    mem_text = torch.empty(4, 6, dtype=torch.float64)
    mem_image[index], mem_text[index] = live_centroids(image), live_centroids(text)
    got = memory_centroid_loss(image, text, mem_image, mem_text, index, TAU, TAU_INNER, ALPHA, return_parts=True,
                               text_ids=ids)
    want = centroid_group_loss(image, text, TAU, TAU_INNER, ALPHA, return_parts=True, text_ids=ids)
    for key in ("loss", "inner", "outer"):
        torch.testing.assert_close(got[key], want[key])
    torch.testing.assert_close(got["centroids"], torch.stack([live_centroids(image), live_centroids(text)]))
    assert torch.equal(got["group_index"], index)


def test_gradient_flows_only_through_live_centroids() -> None:
    """The memory rows get no gradient; the features do; and the loss's gradient equals that of a loss whose
    memory is a constant copy (the memory is never differentiated)."""
    image, text, mem_image, mem_text, index = make_case(requires_grad=True)
    mem_image.requires_grad_(True)
    mem_text.requires_grad_(True)
    loss = memory_centroid_loss(image, text, mem_image, mem_text, index, TAU, TAU_INNER, ALPHA)
    loss.backward()
    assert mem_image.grad is None and mem_text.grad is None
    assert image.grad.abs().sum() > 0 and text.grad.abs().sum() > 0
    # a row the batch replaces has no influence at all: changing it leaves loss and gradient unchanged
    changed_image = mem_image.detach().clone()
    changed_image[index[0]] = F.normalize(torch.ones(6, dtype=torch.float64), dim=0)
    image2, text2 = image.detach().clone().requires_grad_(True), text.detach().clone().requires_grad_(True)
    loss2 = memory_centroid_loss(image2, text2, changed_image, mem_text.detach(), index, TAU, TAU_INNER, ALPHA)
    loss2.backward()
    torch.testing.assert_close(loss2, loss.detach())
    torch.testing.assert_close(image2.grad, image.grad)


def test_memory_loss_rejects_repeated_rows() -> None:
    """A batch holding one memory row twice has no single positive: a clear error, not a silent overwrite."""
    image, text, mem_image, mem_text, _ = make_case()
    with pytest.raises(ValueError, match="distinct memory rows"):
        memory_centroid_loss(image, text, mem_image, mem_text, torch.tensor([1, 1, 2]))
    with pytest.raises(ValueError, match="one memory row per group"):
        memory_centroid_loss(image, text, mem_image, mem_text, torch.tensor([1, 2]))


def test_memory_update_equals_its_formula() -> None:
    """update: mem[g] <- normalize(m * mem[g] + (1 - m) * c[g]) on the batch's rows; other rows unchanged;
    staged updates apply in order on commit, and discard drops them."""
    gen = torch.Generator().manual_seed(1)
    image, text = torch.randn(5, 4, generator=gen), torch.randn(5, 4, generator=gen)
    memory = ConceptMemory(image, text, momentum=0.9)
    before_image, before_text = memory.image.clone(), memory.text.clone()
    index = torch.tensor([3, 0])
    centroids = F.normalize(torch.randn(2, 2, 4, generator=gen), dim=-1)
    memory.stage(index, centroids)
    assert torch.equal(memory.image, before_image)  # staged, not applied
    memory.commit()
    for rows, before, fresh in ((memory.image, before_image, centroids[0]), (memory.text, before_text, centroids[1])):
        torch.testing.assert_close(rows[index], F.normalize(0.9 * before[index] + 0.1 * fresh, dim=-1))
        assert torch.equal(rows[[1, 2, 4]], before[[1, 2, 4]])
    torch.testing.assert_close(memory.image.norm(dim=-1), torch.ones(5))
    after = memory.image.clone()
    memory.stage(index, centroids)
    memory.discard()
    memory.commit()
    assert torch.equal(memory.image, after)


def test_memory_state_dict_round_trip_is_exact() -> None:
    """from_state_dict restores the saved rows bit for bit (an exact resume needs them)."""
    memory = ConceptMemory(torch.randn(4, 3), torch.randn(4, 3), momentum=0.5)
    memory.update(torch.tensor([1]), F.normalize(torch.randn(2, 1, 3), dim=-1))
    restored = ConceptMemory.from_state_dict(memory.state_dict())
    assert torch.equal(restored.image, memory.image) and torch.equal(restored.text, memory.text)
    assert restored.momentum == 0.5


def test_group_centroids_are_normalized_means() -> None:
    """Row g of group_centroids is the unit mean of its members' vectors."""
    vectors = F.normalize(torch.randn(5, 3), dim=-1).numpy()
    out = group_centroids(vectors, [[0, 1], [2, 3, 4]])
    want = F.normalize(torch.from_numpy(vectors[[0, 1]].mean(0)), dim=0).numpy()
    assert abs(out[0] - want).max() < 1e-6


@pytest.mark.parametrize(("loss", "momentum", "match"), [
    ("clip", 0.9, "options.memory_momentum: Extra inputs"), ("centroid", 1.0, "less than 1"),
    ("centroid", 0.0, "greater than 0"), ("memory_centroid", None, "options.memory_momentum: Field required")])
def test_memory_momentum_is_validated(loss: str, momentum: float | None, match: str) -> None:
    """memory_momentum is an option of the centroid losses, strictly inside (0, 1), and memory_centroid needs it."""
    with pytest.raises(ValueError, match=match):
        TrainRunParams(name="x", loss=loss, options={} if momentum is None else {"memory_momentum": momentum})
    assert TrainRunParams(name="x", loss="centroid", options={"memory_momentum": 0.9}).options.memory_momentum == 0.9
