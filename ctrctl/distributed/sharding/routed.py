"""The sharding engine behind TW, CW, TWCW, RW and TWRW: route ids, pool shards, send back.

Each type (``tw.py``, ``rw.py``, ...) is this engine with its geometry check and its output
collective: the pooled all-to-all (blocks placed side by side, row blocks summed at the
source) or the reduce-scatter of row-wise partial sums.

Shapes through one step on a rank with local batch B, global batch Bg (sum over ranks), this
group's features F (output width D) and this rank's slots S (width W)::

    lengths (F, B), ids           -- route + jagged all-to-all -->  lengths (S, Bg), ids
    lookup                        -->  (Bg, W)
    pooled all-to-all             -->  (B, sum of W over ranks)  -- place/sum -->  (B, D)
    or reduce-scatter             (Bg, D) partials  -->  (B, D)

Example:
    >>> group = TwSharding(tables, shardings, EmbeddingOptimizerConfig(lr=0.1))
    >>> out = group(lengths, values, None)      # (B, D)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, cast

import torch
import torch.distributed as dist

from ctrctl.distributed import comm
from ctrctl.distributed.sharding.base import EmbeddingSharding, LocalShard, PendingInput
from ctrctl.distributed.sharding.common import GroupLayout, RoutedInput, route, to_slot_major
from ctrctl.distributed.types import ParameterSharding, ShardMetadata
from ctrctl.modules.batched_embedding import BatchedEmbeddingBag
from ctrctl.modules.cached_embedding import CachedEmbeddingBag, CachedTableSpec
from ctrctl.modules.embedding_configs import EmbeddingBagConfig
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
from ctrctl.sparse.ops import complete_cumsum


class RoutedSharding(EmbeddingSharding[comm.JaggedExchange]):
    """Tables cut into blocks held by single ranks (every type but data-parallel).

    Subclasses set ``sharding_type`` and ``reduce_scatter`` (True: row-wise partial sums come
    back through a reduce-scatter; False: through the pooled all-to-all).
    """

    reduce_scatter = False
    supports_dedup = True
    all_columns: torch.Tensor
    my_columns: torch.Tensor

    def __init__(self, tables: Sequence[EmbeddingBagConfig], shardings: Sequence[ParameterSharding],
                 optimizer: EmbeddingOptimizerConfig, group: Any | None = None,
                 grad_scale: float = 1.0, backend: str = "auto",
                 cached: Mapping[str, CachedTableSpec] | None = None) -> None:
        super().__init__(tables, shardings, optimizer, group, grad_scale, backend, cached)
        self.check_geometry()
        world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.layout = GroupLayout.build(self.tables, self.shardings, world)
        slots = self.layout.slots_per_rank[self.rank]
        local_tables = self.layout.local_tables[self.rank]
        # contiguous runs of slots (and of local tables) that pool the same way on the same
        # kind of kernel (resident, or cached: disk + DRAM rows)
        self.runs: list[tuple[int, int, int, int]] = []   # slot start/end, table start/end
        self.lookups = torch.nn.ModuleList()

        def kind(slot: int) -> tuple[str, bool]:
            table = slots[slot].table
            return (self.layout.lookup_pooling(table),
                    self.layout.tables[table].name in self.cached)

        start = 0
        while start < len(slots):
            end = start
            while end < len(slots) and kind(end) == kind(start):
                end += 1
            mode, is_cached = kind(start)
            t0, t1 = slots[start].local_table, slots[end - 1].local_table + 1
            shapes = [(s.rows, s.cols) for _, s in local_tables[t0:t1]]
            fmap = [s.local_table - t0 for s in slots[start:end]]
            if is_cached:
                self.lookups.append(self._cached_kernel(local_tables[t0:t1], fmap, mode))
            else:
                self.lookups.append(BatchedEmbeddingBag(shapes, fmap, optimizer, mode,
                                                        backend=backend))
            self.runs.append((start, end, t0, t1))
            start = end
        all_columns = self.layout.target_columns()
        self.register_buffer("all_columns", all_columns, persistent=False)
        self.widths = [self.layout.rank_width(r) for r in range(world)]
        # Blocks that tile the output once (no row blocks to sum) are copied into place as
        # they arrive: each rank's block as runs of consecutive output columns.
        self.placement: tuple[int, list[list[comm.ColumnRun]]] | None = None
        if torch.equal(torch.sort(all_columns).values, torch.arange(self.layout.output_dim)):
            targets = all_columns.tolist()
            starts = [sum(self.widths[:r]) for r in range(world)]
            self.placement = (self.layout.output_dim, [
                comm.column_runs(targets[a : a + w])
                for a, w in zip(starts, self.widths, strict=True)])
        self.register_buffer("my_columns", self.layout.target_columns([self.rank]),
                             persistent=False)
        self.dist_buffers = comm.OutputDistBuffers()  # memory the output dist reuses
        mean_features = [f for f, (_, t) in enumerate(self.layout.features)
                         if self.layout.row_split(t) and self.layout.tables[t].pooling == "mean"]
        self.mean_features = mean_features

    def _cached_kernel(self, blocks: Sequence[tuple[int, ShardMetadata]], fmap: list[int],
                       mode: str) -> CachedEmbeddingBag:
        """Cached shards: each block's file starts as its part of the whole table would."""
        specs = [self.cached[self.layout.tables[t].name] for t, _ in blocks]
        return CachedEmbeddingBag(
            [(s.rows, s.cols) for _, s in blocks], fmap, self.optimizer, mode,
            cache_load_factor=[sp.load_factor for sp in specs],
            seeds=[sp.seed for sp in specs], init_ranges=[sp.init_range for sp in specs],
            cache_dir=specs[0].cache_dir,
            names=[f"{self.layout.tables[t].name}.r{s.row_offset}.c{s.col_offset}"
                   for t, s in blocks],
            blocks=[(s.row_offset, s.col_offset, self.layout.tables[t].embedding_dim)
                    for t, s in blocks])

    def kernels(self) -> list[BatchedEmbeddingBag | CachedEmbeddingBag]:
        return [cast(BatchedEmbeddingBag | CachedEmbeddingBag, k) for k in self.lookups]

    def check_geometry(self) -> None:
        """Raise PlanError when a plan entry does not fit this type (subclasses refine)."""

    # ---- the three parts --------------------------------------------------------------------
    def route_input(self, lengths: torch.Tensor, values: torch.Tensor,
                    weights: torch.Tensor | None) -> RoutedInput:
        """The bags and ids each rank gets (bucketized by row block where tables are cut)."""
        return route(self.layout, lengths, values, weights)

    def input_dist(self, lengths: torch.Tensor, values: torch.Tensor,
                   weights: torch.Tensor | None) -> comm.JaggedExchange:
        return self.start_input_dist(lengths, values, weights).wait()

    def start_input_dist(self, lengths: torch.Tensor, values: torch.Tensor,
                         weights: torch.Tensor | None) -> PendingInput[comm.JaggedExchange]:
        """Route now, then the jagged all-to-all by halves: the split sizes in flight here,
        the data once :meth:`PendingExchange.launch` (or ``wait``) is called."""
        routed = self.route_input(lengths, values, weights)
        return PendingExchange(comm.start_jagged_all_to_all(
            routed.lengths, routed.values, routed.weights, lengths.shape[1], self.group))

    def _run_inputs(self, received: comm.JaggedExchange
                    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]:
        """Per run of slots, the (ids, offsets, weights) its kernel pools."""
        num_slots = len(self.layout.slots_per_rank[self.rank])
        global_batch = sum(received.batch_per_source)
        lengths, values, weights = to_slot_major(received.lengths, received.values,
                                                 received.weights, num_slots,
                                                 received.batch_per_source)
        offsets = complete_cumsum(lengths.long())
        inputs = []
        for s0, s1, _, _ in self.runs:
            first, last = s0 * global_batch, s1 * global_batch
            v0, v1 = int(offsets[first]), int(offsets[last])
            inputs.append((values[v0:v1], offsets[first:last + 1] - v0,
                           weights[v0:v1] if weights is not None else None))
        return inputs

    def lookup(self, received: comm.JaggedExchange) -> torch.Tensor:
        if not self.runs:
            # Nothing held here; still take part in backward's collective.
            return torch.zeros(sum(received.batch_per_source), 0, device=received.values.device,
                               requires_grad=torch.is_grad_enabled())
        pooled = [kernel(ids, offsets, weights) for (ids, offsets, weights), kernel in
                  zip(self._run_inputs(received), self.kernels(), strict=True)]
        return pooled[0] if len(pooled) == 1 else torch.cat(pooled, dim=1)    # (Bg, W)

    def prefetch(self, pending: PendingInput[comm.JaggedExchange]) -> None:
        """Wait for a coming batch's ids, then queue their rows' lookup in cached shards."""
        if not any(isinstance(k, CachedEmbeddingBag) for k in self.kernels()):
            return
        for (ids, offsets, _), kernel in zip(self._run_inputs(pending.wait()), self.kernels(),
                                             strict=True):
            if isinstance(kernel, CachedEmbeddingBag):
                kernel.prefetch(ids, offsets)

    def output_dist(self, pooled: torch.Tensor, dist_input: comm.JaggedExchange,
                    lengths: torch.Tensor) -> torch.Tensor:
        out = self.return_pooled(pooled, dist_input.batch_per_source)
        if self.mean_features:
            out = self._divide_means(out, lengths)
        return out

    def return_pooled(self, local: torch.Tensor, batch_per_rank: list[int]) -> torch.Tensor:
        """The collective of stage 3: (Bg, W) pooled here -> (B, D) on each sample's rank
        (the pooled all-to-all, or the reduce-scatter of row-wise partial sums)."""
        batch = batch_per_rank[self.rank]
        if self.reduce_scatter:
            partial = _place_columns(local, self.my_columns, self.layout.output_dim)  # (Bg, D)
            return comm.reduce_scatter_rows(partial, batch_per_rank, self.group,
                                            self.grad_scale, self.dist_buffers)
        if self.placement is not None:
            return comm.pooled_all_to_all(local, batch_per_rank, self.widths, self.group,
                                          self.grad_scale, self.placement,
                                          self.dist_buffers)                    # (B, D)
        received = comm.pooled_all_to_all(local, batch_per_rank, self.widths, self.group,
                                          self.grad_scale)                     # (B, sum W)
        out = received.new_zeros(batch, self.layout.output_dim)
        return out.index_add(1, self.all_columns, received)                   # (B, D)

    def _divide_means(self, out: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        # Row blocks pooled partial sums; the mean needs the whole bag's length, known here.
        scale = torch.ones(out.shape[1], out.shape[0], dtype=out.dtype, device=out.device)
        for f in self.mean_features:
            a, b = self.layout.feature_offsets[f], self.layout.feature_offsets[f + 1]
            scale[a:b] = 1.0 / lengths[f].clamp(min=1).to(out.dtype)
        return out * scale.t()

    # ---- state ------------------------------------------------------------------------------
    def local_shards(self, tables: Collection[str] | None = None) -> list[LocalShard]:
        shards = []
        local_tables = self.layout.local_tables[self.rank]
        for (_, _, t0, t1), kernel in zip(self.runs, self.kernels(), strict=True):
            names = {self.layout.tables[t].name for t, _ in local_tables[t0:t1]}
            if tables is not None and not names & set(tables):
                continue  # not read: reading a cached kernel writes its whole files
            weights = kernel.split_weights()
            states = kernel.optimizer_state()
            for i, (t, shard) in enumerate(local_tables[t0:t1]):
                shards.append(LocalShard(self.layout.tables[t].name, shard, weights[i],
                                         states[i]))
        return shards


class PendingExchange(PendingInput[comm.JaggedExchange]):
    """A routed group's jagged all-to-all in flight (split sizes first, then the data)."""

    def __init__(self, splits: comm.JaggedSplits) -> None:
        self._splits: comm.JaggedSplits | None = splits
        self._data: comm.JaggedData | None = None

    def launch(self) -> None:
        if self._splits is not None:
            self._data, self._splits = self._splits.wait(), None

    def wait(self) -> comm.JaggedExchange:
        self.launch()
        assert self._data is not None
        return self._data.wait()


def _place_columns(local: torch.Tensor, columns: torch.Tensor, width: int) -> torch.Tensor:
    """(rows, W) blocks into (rows, width): column ``j`` of ``local`` goes to ``columns[j]``.

    When this rank holds a block of every feature (row-wise), no zero-filled copy is made.
    """
    if columns.numel() == width:
        every = torch.arange(width, device=columns.device)
        if torch.equal(columns, every):
            return local
        if torch.equal(torch.sort(columns).values, every):      # a permutation
            return local.index_select(1, torch.argsort(columns))
    return local.new_zeros(local.shape[0], width).index_add(1, columns, local)
