"""Glue between sharded modules and checkpoints: gather, export and import full tables.

Example:
    >>> full = gather_table_weights(sharded_ebc)     # on every rank: name -> full table
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ctrctl.distributed import comm
from ctrctl.distributed.embeddingbag import ShardedEmbeddingBagCollection


def gather_table_weights(
    module: ShardedEmbeddingBagCollection, group: object | None = None
) -> dict[str, torch.Tensor]:
    """Every table's full (unsharded) weight, assembled on every rank from all ranks' shards.

    Meant for export and tests (it moves every table through every rank): checkpoints of
    large models save shards instead.
    """
    mine = [(s.table, s.metadata, s.weight.detach().clone()) for s in module.local_shards()]
    gathered: list[object] = [None] * dist.get_world_size(group)
    with comm.collective("gather of table weights"):
        dist.all_gather_object(gathered, mine, group=group)
    full: dict[str, torch.Tensor] = {
        t.name: torch.zeros(t.num_embeddings, t.embedding_dim) for t in module.tables}
    for shards in gathered:
        for table, meta, weight in shards:  # type: ignore[union-attr]
            full[table][meta.row_offset:meta.row_offset + meta.rows,
                        meta.col_offset:meta.col_offset + meta.cols] = weight
    return full
