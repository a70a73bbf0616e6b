"""Rank bodies for the multi-process checkpoint tests (importable by spawned processes)."""

from __future__ import annotations

from pathlib import Path

import torch

from ctrctl.checkpoint import TableShard, save_checkpoint


def full_tables(seed: int = 0) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Two tables with a weight, a row state and an element state, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (rows, dim) in {"t_a": (10, 8), "t_b": (7, 4)}.items():
        out[name] = (torch.randn(rows, dim, generator=g), torch.rand(rows, generator=g),
                     torch.rand(rows, dim, generator=g))
    return out


def save_row_wise(rank: int, world_size: int, folder: str) -> str:
    """Each rank saves its row block of every table (row-wise sharding) at step 3."""
    shards = []
    for name, (weight, row_state, elem_state) in full_tables().items():
        rows = weight.shape[0]
        block = -(-rows // world_size)
        lo, hi = rank * block, min(rows, (rank + 1) * block)
        if lo < hi:
            shards.append(TableShard(name, lo, 0, weight[lo:hi].clone(),
                                     {"momentum": row_state[lo:hi].clone(),
                                      "sum": elem_state[lo:hi].clone()}))
    path = save_checkpoint(
        Path(folder), 3, shards, {"dense.w": torch.ones(2)}, {"state": {}, "param_groups": []},
        {"epoch": 0, "batch": 3},
        {"tables": {n: {"rows": w.shape[0], "dim": w.shape[1], "optimizer": "test"}
                    for n, (w, _, _) in full_tables().items()}},
        rank=rank, world_size=world_size,
    )
    return str(path)
