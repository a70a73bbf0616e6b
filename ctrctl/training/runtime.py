"""Where a training process runs: its device, its rank and world size, and one sum over
the ranks. Shared by the train loop and its helpers."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ctrctl.errors import ConfigError

__all__ = ["global_sum", "resolve_device", "world"]


def resolve_device(kind: str) -> torch.device:
    """``auto`` -> cuda when present (this rank's local device), else cpu."""
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("training.device is cuda but no CUDA device is present",
                              where="training.device", hint="use auto or cpu")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def world() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def global_sum(value: int, world_size: int) -> int:
    """``value`` summed over the ranks (itself in one process)."""
    if world_size == 1:
        return value
    box = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(box)
    return int(box.item())
