"""Table-row-wise sharding: a table's row blocks on the ranks of one host.

Input: as row-wise (:mod:`ctrctl.distributed.sharding.rw`), ids bucketized by row block and
sent to the block's rank, always on the table's host. Lookup: partial sums over the global
batch. Output, in two stages, so that partial sums cross hosts only once summed:

1. a **reduce-scatter within the host** (backward: all-gather) sums the host's partials and
   leaves host rank ``l`` the rows of every source rank with local index ``l``;
2. an **all-to-all across hosts** among the ranks with the same local index sends those rows
   to their source rank, where each host's features are placed in the output.

With one host stage 2 is empty and this is row-wise over the host. Ranks ``h * L + l``
(``L`` ranks per host) are host ``h``, local index ``l``, as torchrun numbers them.

Example:
    >>> TwrwSharding(tables, shardings, optimizer, local_world_size=2)(lengths, values, None)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ctrctl.distributed import comm
from ctrctl.distributed.sharding.routed import _place_columns
from ctrctl.distributed.sharding.rw import RwSharding
from ctrctl.distributed.types import ParameterSharding
from ctrctl.errors import PlanError
from ctrctl.modules.cached_embedding import CachedTableSpec
from ctrctl.modules.embedding_configs import EmbeddingBagConfig
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
from ctrctl.names import ShardingType


class TwrwSharding(RwSharding):
    """Row blocks within one host; host reduce-scatter, then cross-host all-to-all."""

    sharding_type = ShardingType.TABLE_ROW_WISE.value
    reduce_scatter = False
    host_columns: torch.Tensor
    place_columns: torch.Tensor

    def __init__(self, tables: Sequence[EmbeddingBagConfig], shardings: Sequence[ParameterSharding],
                 optimizer: EmbeddingOptimizerConfig, group: Any | None = None,
                 grad_scale: float = 1.0, backend: str = "auto",
                 cached: Mapping[str, CachedTableSpec] | None = None,
                 local_world_size: int | None = None) -> None:
        super().__init__(tables, shardings, optimizer, group, grad_scale, backend, cached)
        world = dist.get_world_size(group)
        local = local_world_size or world
        if world % local:
            raise PlanError(f"{local} ranks per host do not divide the world of {world}",
                            where="table_row_wise")
        self.local, self.hosts = local, world // local
        self.host, self.local_rank = divmod(self.rank, local)
        # memory the two stages of the output dist reuse between steps
        self.host_buffers, self.cross_buffers = comm.OutputDistBuffers(), comm.OutputDistBuffers()
        layout = self.layout
        table_host = []
        for table, ps in zip(self.tables, self.shardings, strict=True):
            hosts = {s.rank // local for s in ps.shards}
            if len(hosts) != 1:
                raise PlanError(f"table_row_wise shards span hosts {sorted(hosts)}",
                                where=f"table {table.name!r}")
            table_host.append(hosts.pop())
        # features of each host, in group order, and their columns in the host's partials
        self.host_features = [[f for f, (_, t) in enumerate(layout.features)
                               if table_host[t] == h] for h in range(self.hosts)]
        self.host_widths = [sum(layout.feature_dims[f] for f in fs) for fs in self.host_features]
        host_offset = {}
        for fs in self.host_features:
            start = 0
            for f in fs:
                host_offset[f] = start
                start += layout.feature_dims[f]
        mine = [torch.arange(host_offset[s.feature], host_offset[s.feature] + s.shard.cols)
                for s in layout.slots_per_rank[self.rank]]
        self.register_buffer("host_columns", torch.cat(mine) if mine else
                             torch.zeros(0, dtype=torch.long), persistent=False)
        # received blocks (host by host) -> output columns
        placed = torch.cat([torch.arange(layout.feature_offsets[f], layout.feature_offsets[f + 1])
                            for fs in self.host_features for f in fs])
        self.register_buffer("place_columns", torch.argsort(placed), persistent=False)
        self.place_identity = bool(torch.equal(placed, torch.arange(placed.numel())))
        # Sub-groups: every rank creates every group, in the same order.
        self.host_group, self.cross_group = group, None
        if self.hosts > 1:
            ranks = dist.get_process_group_ranks(group) if group is not None \
                else list(range(world))
            for h in range(self.hosts):
                g = comm.new_group(ranks[h * local:(h + 1) * local], parent=group)
                if h == self.host:
                    self.host_group = g
            for lr in range(local):
                g = comm.new_group(ranks[lr::local], parent=group)
                if lr == self.local_rank:
                    self.cross_group = g

    def return_pooled(self, local: torch.Tensor, batch_per_rank: list[int]) -> torch.Tensor:
        width = self.host_widths[self.host]
        # rows by source (h', l') -> by (l', h'): host rank l' gets a contiguous chunk
        sources = sorted(range(len(batch_per_rank)),
                         key=lambda s: (s % self.local, s // self.local))
        starts = [0]
        for b in batch_per_rank:
            starts.append(starts[-1] + b)
        rows = None if self.hosts == 1 else torch.cat(
            [torch.arange(starts[s], starts[s + 1], device=local.device) for s in sources])
        chunk = [sum(batch_per_rank[h * self.local + lr] for h in range(self.hosts))
                 for lr in range(self.local)]
        if width:
            partial = _place_columns(local, self.host_columns, width)         # (Bg, D_h)
            if rows is not None:
                partial = partial.index_select(0, rows)
            summed = comm.reduce_scatter_rows(partial, chunk, self.host_group,  # (chunk_l, D_h)
                                              buffers=self.host_buffers)
        else:
            summed = local.new_zeros(chunk[self.local_rank], 0,
                                     requires_grad=torch.is_grad_enabled())
        if self.cross_group is None:
            received = summed
            if self.grad_scale != 1.0:
                received = _ScaleGrad.apply(received, self.grad_scale)
        else:
            batches = [batch_per_rank[h * self.local + self.local_rank]
                       for h in range(self.hosts)]
            received = comm.pooled_all_to_all(summed, batches, self.host_widths,
                                              self.cross_group, self.grad_scale,
                                              buffers=self.cross_buffers)
        if self.place_identity:
            return received
        return received.index_select(1, self.place_columns)                   # (B, D)


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient scaled on its way back (gradient division)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:  # type: ignore[override]
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return grad * ctx.scale, None
