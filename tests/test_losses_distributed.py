"""Distributed losses: 2 CPU processes on gloo, under DDP, against one process holding the whole batch.

Convention checked (see cglib.losses): every rank returns the loss of the global batch; the gradient w.r.t. a
rank's local features is world_size times the single-process gradient of those features, so that DDP's
averaging of parameter gradients over ranks yields exactly the single-process parameter gradient.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from cglib.losses import centroid_group_loss, clip_loss, pairwise_group_loss, text_alignment_loss

pytestmark = pytest.mark.slow  # spawns two processes that import torch

WORLD_SIZE = 2
M_PER_RANK, N, IN_DIM, DIM = 2, 3, 10, 6

# Text ids of the global batch, (WORLD_SIZE * M_PER_RANK, N): duplicates across ranks (id 0 on both, id 2 in groups
# 0 and 3) and groups 1 and 2, on different ranks, holding the same texts: masking needs the gathered ids.
GLOBAL_IDS = torch.tensor([[0, 1, 2], [3, 4, 5], [5, 3, 4], [0, 2, 6]])

LOSSES = {  # tau: the model's learned temperature (a 0-dim tensor); tau' fixed; ids: this process's text ids
    "pairwise": lambda i, t, tau, ids: pairwise_group_loss(i, t, tau, 0.2, 0.7),
    "pairwise_authors": lambda i, t, tau, ids: pairwise_group_loss(i, t, tau, 0.2, 1.2233, alpha_on="outer",
                                                                   normalize_products=True),
    "centroid": lambda i, t, tau, ids: centroid_group_loss(i, t, tau, 0.2, 0.7),
    "clip": lambda i, t, tau, ids: clip_loss(i, t, tau),
    "text_alignment": lambda i, t, tau, ids: text_alignment_loss(i.reshape(-1, DIM), t.reshape(-1, DIM), tau),
    "pairwise_ids": lambda i, t, tau, ids: pairwise_group_loss(i, t, tau, 0.2, 0.7, text_ids=ids),
    "centroid_ids": lambda i, t, tau, ids: centroid_group_loss(i, t, tau, 0.2, 0.7, text_ids=ids),
    "clip_ids": lambda i, t, tau, ids: clip_loss(i, t, tau, text_ids=ids),
    "text_alignment_ids": lambda i, t, tau, ids: text_alignment_loss(i.reshape(-1, DIM), t.reshape(-1, DIM), tau,
                                                                     text_ids=ids.reshape(-1)),
}


class TwoTowers(torch.nn.Module):
    """A stand-in for CLIP: one linear projection per modality, outputs (M, N, DIM) features, and a learned
    temperature."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.image = torch.nn.Linear(IN_DIM, DIM, dtype=torch.float64)
        self.text = torch.nn.Linear(IN_DIM, DIM, dtype=torch.float64)
        self.log_tau = torch.nn.Parameter(torch.tensor(0.1, dtype=torch.float64).log())

    def forward(self, x_image: torch.Tensor, x_text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.image(x_image), self.text(x_text), self.log_tau.exp()


def global_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs of all ranks together: (WORLD_SIZE * M_PER_RANK, N, IN_DIM) per modality."""
    gen = torch.Generator().manual_seed(1)
    shape = (WORLD_SIZE * M_PER_RANK, N, IN_DIM)
    return torch.randn(shape, generator=gen, dtype=torch.float64), torch.randn(shape, generator=gen, dtype=torch.float64)


def run_losses(model: torch.nn.Module, x_image: torch.Tensor, x_text: torch.Tensor, ids: torch.Tensor
               ) -> dict[str, dict]:
    """Loss value, feature gradients and (DDP-averaged, when wrapped) parameter gradients of every loss."""
    results = {}
    for name, loss_fn in LOSSES.items():
        model.zero_grad(set_to_none=True)
        image, text, tau = model(x_image, x_text)
        image.retain_grad()
        text.retain_grad()
        loss = loss_fn(image, text, tau, ids)
        loss.backward()
        params = model.module if isinstance(model, DistributedDataParallel) else model
        results[name] = {"loss": loss.detach(), "image_grad": image.grad, "text_grad": text.grad,
                         "param_grads": {k: p.grad.clone() for k, p in params.named_parameters()}}
    return results


def worker(rank: int, port: int, out_dir: str) -> None:
    """One rank: DDP model on its shard of whole groups; saves its results and the shape-mismatch error."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    try:
        torch.set_num_threads(1)
        x_image, x_text = global_batch()
        shard = slice(rank * M_PER_RANK, (rank + 1) * M_PER_RANK)
        model = DistributedDataParallel(TwoTowers())
        results = run_losses(model, x_image[shard], x_text[shard], GLOBAL_IDS[shard])
        # ranks holding different numbers of groups must fail loudly, not hang or mix groups
        try:
            uneven = torch.randn(rank + 1, N, DIM)
            centroid_group_loss(uneven, uneven)
            results["uneven_error"] = ""
        except ValueError as exc:
            results["uneven_error"] = str(exc)
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def distributed_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out_dir = tmp_path_factory.mktemp("dist")
    mp.spawn(worker, args=(free_port(), str(out_dir)), nprocs=WORLD_SIZE, join=True)
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(WORLD_SIZE)]


@pytest.fixture(scope="module")
def single_results() -> dict:
    x_image, x_text = global_batch()
    return run_losses(TwoTowers(), x_image, x_text, GLOBAL_IDS)


@pytest.mark.parametrize("name", list(LOSSES))
def test_every_rank_returns_the_single_process_loss(distributed_results, single_results, name: str) -> None:
    """Each rank's loss equals the loss of one process over the concatenated batch (groups gathered along M)."""
    for rank_results in distributed_results:
        torch.testing.assert_close(rank_results[name]["loss"], single_results[name]["loss"])


@pytest.mark.parametrize("name", list(LOSSES))
def test_ddp_parameter_gradients_equal_single_process(distributed_results, single_results, name: str) -> None:
    """After DDP averages parameter gradients over ranks (projections and the learned temperature), they equal the
    single-process gradients."""
    for rank_results in distributed_results:
        for key, grad in single_results[name]["param_grads"].items():
            torch.testing.assert_close(rank_results[name]["param_grads"][key], grad)


@pytest.mark.parametrize("name", list(LOSSES))
def test_local_feature_gradients_are_world_size_times_single_process(distributed_results, single_results,
                                                                     name: str) -> None:
    """Gradient w.r.t. a rank's own features = world_size x the single-process gradient of those features."""
    for rank, rank_results in enumerate(distributed_results):
        shard = slice(rank * M_PER_RANK, (rank + 1) * M_PER_RANK)
        for key in ("image_grad", "text_grad"):
            torch.testing.assert_close(rank_results[name][key], WORLD_SIZE * single_results[name][key][shard])


@pytest.mark.parametrize("name", ["pairwise", "centroid", "clip", "text_alignment"])
def test_masking_across_ranks_changes_the_loss(single_results, name: str) -> None:
    """The ids above do mask something in every loss, so the distributed check covers the gathered ids."""
    assert single_results[f"{name}_ids"]["loss"] < single_results[name]["loss"]


def test_uneven_shards_raise_value_error(distributed_results) -> None:
    """Ranks holding different numbers of groups get a ValueError that says to equalize them."""
    for rank_results in distributed_results:
        assert "different shapes" in rank_results["uneven_error"]
