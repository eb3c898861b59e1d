"""DDP under torchrun: process rank, world size and device; ranks hold whole groups of each batch.

`torchrun --nproc_per_node K -m cglib.train PARAMS --runs NAME` sets RANK/WORLD_SIZE/LOCAL_RANK; every rank
builds the same batch (a pure function of seed, epoch, index) and keeps its contiguous slice of M/K groups.
The losses gather all ranks' features themselves (cglib.losses.gather_groups), so the loss is the global
batch's, and DDP's gradient averaging then gives exactly the single-process gradient. NCCL on CUDA, gloo on CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: rank, world size, local rank and its torch device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed(device: str) -> DistInfo:
    """Join the torchrun process group when WORLD_SIZE > 1 (else single process); pick this rank's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1 and not (dist.is_available() and dist.is_initialized()):
        return DistInfo(device=torch.device(device))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        torch.cuda.set_device(local_rank)
        torch_device = torch.device("cuda", local_rank)
    else:
        torch_device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch_device.type == "cuda" else "gloo")
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, torch_device)


def current(device: str | torch.device = "cpu") -> DistInfo:
    """DistInfo of an already initialized process group (single process when none)."""
    torch_device = torch.device(device)
    if dist.is_available() and dist.is_initialized():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch_device.type == "cuda" and torch_device.index is None:
            torch_device = torch.device("cuda", local_rank)
        return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, torch_device)
    return DistInfo(device=torch_device)


def barrier(info: DistInfo) -> None:
    """Wait for every rank (no-op in a single process)."""
    if info.distributed:
        dist.barrier()
