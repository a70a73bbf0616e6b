"""Glue between sharded modules and the checkpoint format (:mod:`ctrctl.checkpoint`).

Each rank saves the blocks it holds (data-parallel replicas once, from rank 0); loading asks
the checkpoint for exactly the blocks the *current* plan puts on this rank, assembled from
whichever saved pieces overlap them, so a model saved on 2 ranks resumes on 3, or on 1, or
under another plan. Full tables go out (:func:`gather_table_weights`, for export) and come in
(:func:`load_full_weights`) unsharded.

Example:
    >>> path = save_sharded(out / "checkpoints", step, dmp, dense_state, opt.state_dict(),
    ...                     {"epoch": 0}, metadata)
    >>> load_sharded(path, new_dmp)                 # any world size, any plan
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ctrctl import checkpoint as ckpt
from ctrctl.distributed import comm
from ctrctl.distributed.embeddingbag import ShardedEmbeddingBagCollection
from ctrctl.distributed.sharding.base import LocalShard
from ctrctl.distributed.types import ShardMetadata
from ctrctl.errors import CheckpointError
from ctrctl.modules.embedding_modules import EmbeddingBagCollection


def _sharded(module: nn.Module) -> list[ShardedEmbeddingBagCollection]:
    return [m for m in module.modules() if isinstance(m, ShardedEmbeddingBagCollection)]


def _collections(module: nn.Module
                 ) -> list[ShardedEmbeddingBagCollection | EmbeddingBagCollection]:
    """Every embedding collection in ``module``, sharded or not, outermost only."""
    found: list[tuple[str, ShardedEmbeddingBagCollection | EmbeddingBagCollection]] = []
    for name, m in module.named_modules():
        if any(name.startswith(f"{outer}.") or not outer for outer, _ in found):
            continue
        if isinstance(m, ShardedEmbeddingBagCollection | EmbeddingBagCollection):
            found.append((name, m))
    return [m for _, m in found]


def local_shards(module: nn.Module, with_replicas: bool = True) -> list[LocalShard]:
    """The table blocks this rank holds in ``module``: a DMP, a model, a sharded collection or
    an unsharded one (whose tables are whole blocks at offset 0).

    Args:
        with_replicas: include data-parallel replicas (False on ranks other than the one that
            saves them).
    """
    shards = []
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    for m in _collections(module):
        if isinstance(m, ShardedEmbeddingBagCollection):
            shards += [s for s in m.local_shards() if with_replicas or not s.replicated]
            continue
        states = m.optimizer_state()
        for name, weight in m.embedding_bag_weights().items():
            rows, cols = int(weight.shape[0]), int(weight.shape[1])
            shards.append(LocalShard(name, ShardMetadata(rank, 0, 0, rows, cols), weight,
                                     dict(states.get(name, {}))))
    return shards


def table_shards(module: nn.Module, rank: int = 0) -> list[ckpt.TableShard]:
    """This rank's blocks of every table, with optimizer state, as checkpoint pieces.

    Data-parallel tables are replicated on every rank: only rank 0 saves them, so a
    checkpoint holds each block of each table once.

    Args:
        module: an unsharded model or collection, or one wrapped by DistributedModelParallel.
        rank: this process's rank in the group that writes the checkpoint.
    """
    return [ckpt.TableShard(s.table, s.metadata.row_offset, s.metadata.col_offset,
                            s.weight.detach(), dict(s.optimizer_state))
            for s in local_shards(module, with_replicas=rank == 0)]


def save_sharded(
    checkpoints: str | Path,
    step: int,
    module: nn.Module,
    dense_state: Mapping[str, torch.Tensor],
    dense_optim_state: Mapping[str, Any],
    trainer_state: Mapping[str, Any],
    metadata: Mapping[str, Any],
    process_group: Any | None = None,
) -> Path:
    """Write a checkpoint of a sharded model atomically; every rank calls it.

    A rank that dies while writing leaves only a temporary folder: the step folder appears
    (by rename) after every rank has written its pieces.
    """
    rank, world = dist.get_rank(process_group), dist.get_world_size(process_group)
    with comm.collective("sharded checkpoint save"):
        return ckpt.save_checkpoint(checkpoints, step, table_shards(module, rank), dense_state,
                                    dense_optim_state, trainer_state, metadata, rank=rank,
                                    world_size=world, process_group=process_group)


@torch.no_grad()
def load_sharded(path: str | Path, module: nn.Module, with_optimizer: bool = True) -> None:
    """Fill every block this rank holds from a checkpoint written under any world size/plan."""
    shards = local_shards(module)
    wanted = [(s.table, s.metadata.row_offset, s.metadata.col_offset, s.metadata.rows,
               s.metadata.cols) for s in shards]
    loaded = ckpt.load_table_shards(path, wanted, with_optimizer=with_optimizer)
    for shard, piece in zip(shards, loaded, strict=True):
        shard.weight.copy_(piece.weight.to(shard.weight.dtype))
        if not with_optimizer:
            continue
        if set(shard.optimizer_state) != set(piece.optimizer_state):
            raise CheckpointError(
                f"table {shard.table!r}: the checkpoint holds optimizer state "
                f"{sorted(piece.optimizer_state)} but the model's is "
                f"{sorted(shard.optimizer_state)}", where=str(path),
                hint="resume with the same embedding_optimizer.kind")
        for name, target in shard.optimizer_state.items():
            target.copy_(piece.optimizer_state[name].reshape(target.shape).to(target.dtype))


def gather_table_weights(module: nn.Module, group: Any | None = None) -> dict[str, torch.Tensor]:
    """Every table's full (unsharded) weight, assembled on every rank from all ranks' blocks.

    For export and tests (every table passes through every rank); checkpoints save blocks.
    """
    mine = [(s.table, s.metadata, s.weight.detach().clone())
            for s in local_shards(module, with_replicas=dist.get_rank(group) == 0)]
    gathered: list[Any] = [None] * dist.get_world_size(group)
    with comm.collective("gather of table weights"):
        dist.all_gather_object(gathered, mine, group=group)
    full = {t.name: torch.zeros(t.num_embeddings, t.embedding_dim)
            for m in _sharded(module) for t in m.tables}
    for shards in gathered:
        for table, meta, weight in shards:
            full[table][meta.row_offset:meta.row_offset + meta.rows,
                        meta.col_offset:meta.col_offset + meta.cols] = weight
    return full


@torch.no_grad()
def load_full_weights(module: nn.Module, weights: Mapping[str, torch.Tensor],
                      optimizer_states: Mapping[str, Mapping[str, torch.Tensor]]
                      | None = None) -> None:
    """Import full (unsharded) tables, e.g. from ``export_table_weights``, into the blocks."""
    for m in _sharded(module):
        missing = [t.name for t in m.tables if t.name not in weights]
        if missing:
            raise CheckpointError(f"no weights for tables {missing}",
                                  hint="export every table of the model")
        for t in m.tables:
            if tuple(weights[t.name].shape) != (t.num_embeddings, t.embedding_dim):
                raise CheckpointError(
                    f"table {t.name!r}: weight of shape {tuple(weights[t.name].shape)} does "
                    f"not fit ({t.num_embeddings}, {t.embedding_dim})")
        m.load_table_weights(weights, optimizer_states)
        for s in m.local_shards():
            if s.replicated:
                s.weight.copy_(weights[s.table])
