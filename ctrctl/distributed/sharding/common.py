"""Shard geometry and routing shared by the table/row/column-wise sharding types.

Every non-replicated sharding type cuts tables into blocks (a *shard*: rows x columns held by
one rank) and does the same three things; only the geometry and the output collective differ:

1. **input distribution**: each id of a feature goes to the rank(s) holding its row: all
   column blocks of its row block (TW/CW/TWCW: the one row block; RW/TWRW: the block its id
   falls in, the id made local by subtracting the block's first row);
2. **lookup**: each rank pools its shards for the samples of *every* rank (one grouped
   embedding kernel over its shards);
3. **output distribution**: pooled blocks go back to the rank the samples came from, where
   column blocks are placed side by side and row blocks are summed.

A *slot* is one (feature, shard) pair: the unit the input distribution sends and the lookup
pools. For a table ``t`` (feature ``f``, 10 rows x dim 8) row-wise on 2 ranks and a table
``u`` (feature ``g``, dim 4) table-wise on rank 1::

    rank 0 slots: (f, rows 0-4)                  local tables: t[0:5]
    rank 1 slots: (f, rows 5-9), (g, all)        local tables: t[5:10], u

On a rank the received bags are laid out slot-major over the global batch, the layout the
embedding kernel wants::

    lengths = | slot 0: B_0 bags of rank 0, B_1 bags of rank 1 | slot 1: ... |

Example:
    >>> layout = GroupLayout.build(tables, shardings, world_size=2)
    >>> layout.slots_per_rank[1]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ctrctl.distributed.types import ParameterSharding, ShardMetadata
from ctrctl.errors import PlanError
from ctrctl.modules.embedding_configs import EmbeddingBagConfig
from ctrctl.sparse.ops import complete_cumsum, permute_2d_sparse, segment_ranges, use_fbgemm_ops


@dataclass(frozen=True)
class Slot:
    """One (feature, shard) pair on one rank.

    Attributes:
        feature: index of the feature in the group's feature list.
        table: index of the table in the group's table list.
        shard: the block of the table.
        local_table: index of the shard among the tables of its rank's lookup.
        bucket: for tables split by rows, the index of the row block (else 0).
    """

    feature: int
    table: int
    shard: ShardMetadata
    local_table: int
    bucket: int


@dataclass
class GroupLayout:
    """Geometry of the tables of one sharding group across the world.

    Attributes:
        tables: the group's tables, in order.
        features: (feature name, table index) in output order.
        feature_dims: the dimension of each feature's output block.
        row_blocks: for each table, its distinct row blocks as (row_offset, rows), sorted.
        local_tables: for each rank, the shards it holds as (table index, shard).
        slots_per_rank: for each rank, its slots in lookup order.
    """

    tables: list[EmbeddingBagConfig]
    features: list[tuple[str, int]]
    feature_dims: list[int]
    row_blocks: list[list[tuple[int, int]]]
    local_tables: list[list[tuple[int, ShardMetadata]]]
    slots_per_rank: list[list[Slot]]
    feature_offsets: list[int] = field(default_factory=list)

    @staticmethod
    def build(
        tables: Sequence[EmbeddingBagConfig], shardings: Sequence[ParameterSharding], world_size: int
    ) -> GroupLayout:
        """Lay out ``tables`` (sharded as ``shardings``, same order) over ``world_size`` ranks."""
        features: list[tuple[str, int]] = []
        dims: list[int] = []
        for t, table in enumerate(tables):
            for name in table.feature_names:
                features.append((name, t))
                dims.append(table.embedding_dim)
        row_blocks = []
        local_tables: list[list[tuple[int, ShardMetadata]]] = [[] for _ in range(world_size)]
        for t, (table, ps) in enumerate(zip(tables, shardings, strict=True)):
            blocks = sorted({(s.row_offset, s.rows) for s in ps.shards})
            row_blocks.append(blocks)
            for shard in sorted(ps.shards, key=lambda s: (s.row_offset, s.col_offset)):
                if not 0 <= shard.rank < world_size:
                    raise PlanError(f"shard on rank {shard.rank} outside the world of "
                                    f"{world_size}", where=f"table {table.name!r}")
                local_tables[shard.rank].append((t, shard))
        # One kernel per pooling mode on a rank: order its shards by the mode they pool with
        # (tables cut by rows pool partial sums; the mean is taken at the source).
        layout_modes = ["sum" if len(b) > 1 else t.pooling for t, b in zip(tables, row_blocks,
                                                                               strict=True)]
        for shards in local_tables:
            shards.sort(key=lambda ts: (layout_modes[ts[0]] != "sum", ts[0],
                                        ts[1].row_offset, ts[1].col_offset))
        slots: list[list[Slot]] = [[] for _ in range(world_size)]
        for rank in range(world_size):
            for local, (t, shard) in enumerate(local_tables[rank]):
                bucket = row_blocks[t].index((shard.row_offset, shard.rows))
                for f, (_, ft) in enumerate(features):
                    if ft == t:
                        slots[rank].append(Slot(f, t, shard, local, bucket))
        offsets = [0]
        for d in dims:
            offsets.append(offsets[-1] + d)
        return GroupLayout(list(tables), features, dims, row_blocks, local_tables, slots,
                           offsets)

    @property
    def world_size(self) -> int:
        return len(self.slots_per_rank)

    @property
    def feature_names(self) -> list[str]:
        return [name for name, _ in self.features]

    @property
    def output_dim(self) -> int:
        return self.feature_offsets[-1]

    def lookup_pooling(self, table: int) -> str:
        """The pooling the kernel applies to ``table``'s shards (sum for row-split tables)."""
        return "sum" if self.row_split(table) else self.tables[table].pooling

    def row_split(self, table: int) -> bool:
        """Whether the table is cut into several row blocks (RW/TWRW)."""
        return len(self.row_blocks[table]) > 1

    def slot_widths(self, rank: int) -> list[int]:
        return [s.shard.cols for s in self.slots_per_rank[rank]]

    def rank_width(self, rank: int) -> int:
        return sum(self.slot_widths(rank))

    def target_columns(self, ranks: Sequence[int] | None = None) -> torch.Tensor:
        """For the slots of ``ranks`` side by side, the output column of each of their columns."""
        cols: list[torch.Tensor] = []
        for rank in (range(self.world_size) if ranks is None else ranks):
            for slot in self.slots_per_rank[rank]:
                start = self.feature_offsets[slot.feature] + slot.shard.col_offset
                cols.append(torch.arange(start, start + slot.shard.cols))
        return torch.cat(cols) if cols else torch.zeros(0, dtype=torch.long)


# ---- sender side: bucketize and route ---------------------------------------------------------
def uniform_block_size(blocks: Sequence[tuple[int, int]], rows: int) -> int | None:
    """The block size when the row blocks are TorchRec's (``ceil(rows / n)``, last one short)."""
    size = blocks[0][1]
    for i, (offset, n) in enumerate(blocks):
        if offset != i * size:
            return None
        if n != size and not (i == len(blocks) - 1 and offset + n == rows):
            return None
    return size


def bucketize_by_rows(
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: torch.Tensor | None,
    blocks: Sequence[tuple[int, int]],
    rows: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Split bags by the row block each id falls in; ids become block-local.

    Args:
        lengths: (F, B) bag lengths of the features of one table.
        values: their ids, feature-major.
        weights: optional per-id weights.
        blocks: the table's row blocks as (row_offset, rows), sorted.
        rows: the table's row count.

    Returns:
        (lengths (n_blocks, F, B), block-local ids grouped by block then bag, weights likewise).
        Within a bag, ids keep their order.
    """
    n = len(blocks)
    num_features, batch = lengths.shape
    size = uniform_block_size(blocks, rows)
    if size is not None and use_fbgemm_ops() and values.device.type == "cpu":
        block_sizes = torch.full((num_features,), size, dtype=values.dtype)
        new_lengths, new_values, new_weights, _, _ = (
            torch.ops.fbgemm.block_bucketize_sparse_features(
                lengths.reshape(-1), values, False, False, block_sizes, n, weights))
        return new_lengths.view(n, num_features, batch), new_values, new_weights
    starts = torch.tensor([b[0] for b in blocks], dtype=values.dtype, device=values.device)
    bucket = torch.searchsorted(starts, values, right=True) - 1          # (nnz,)
    bags = num_features * batch
    bag = torch.repeat_interleave(torch.arange(bags, device=values.device), lengths.reshape(-1))
    key = bucket * bags + bag
    order = torch.argsort(key, stable=True)
    new_values = values[order] - starts[bucket[order]]
    new_lengths = torch.bincount(key, minlength=n * bags).to(lengths.dtype)
    new_weights = weights[order] if weights is not None else None
    return new_lengths.view(n, num_features, batch), new_values, new_weights


@dataclass
class RoutedInput:
    """Per destination rank, the bags it must receive from this rank (slot-major)."""

    lengths: list[torch.Tensor]
    values: list[torch.Tensor]
    weights: list[torch.Tensor] | None


def route(
    layout: GroupLayout,
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: torch.Tensor | None,
) -> RoutedInput:
    """Cut this rank's bags of the group's features into what each rank must receive.

    Args:
        layout: the group's geometry.
        lengths: (F, B) lengths of the group's features, in ``layout.features`` order.
        values: their ids, feature-major.
        weights: optional per-id weights.
    """
    if not any(layout.row_split(t) for t in range(len(layout.tables))):
        return route_whole_features(layout, lengths, values, weights)
    sizes = _uniform_row_wise_blocks(layout)
    if sizes is not None and use_fbgemm_ops() and values.device.type == "cpu":
        return _route_row_wise(layout, sizes, lengths, values, weights)
    num_features, batch = lengths.shape
    per_feature = lengths.sum(dim=1).tolist()
    values_f = list(values.split(per_feature))
    weights_f = list(weights.split(per_feature)) if weights is not None else None
    # (table -> (lengths (n, F_t, B), values per (block, feature), weights per ...)) for
    # tables cut by rows
    buckets: dict[int, tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor] | None]] = {}
    for t, table in enumerate(layout.tables):
        if not layout.row_split(t):
            continue
        feats = [f for f, (_, ft) in enumerate(layout.features) if ft == t]
        first, last = feats[0], feats[-1] + 1  # a table's features are contiguous
        b_len, b_val, b_wt = bucketize_by_rows(
            lengths[first:last],
            torch.cat(values_f[first:last]),
            torch.cat(weights_f[first:last]) if weights_f is not None else None,
            layout.row_blocks[t], table.num_embeddings)
        counts = b_len.sum(dim=2).reshape(-1).tolist()    # per (block, feature)
        buckets[t] = (b_len, list(b_val.split(counts)),
                      list(b_wt.split(counts)) if b_wt is not None else None)
    out_len: list[torch.Tensor] = []
    out_val: list[torch.Tensor] = []
    out_wt: list[torch.Tensor] | None = [] if weights is not None else None
    empty_len = lengths.new_zeros(0)
    for rank in range(layout.world_size):
        seg_len, seg_val, seg_wt = [], [], []
        for slot in layout.slots_per_rank[rank]:
            if slot.table in buckets:
                s_len, s_vals, s_wts = buckets[slot.table]
                first = next(f for f, (_, ft) in enumerate(layout.features) if ft == slot.table)
                k = slot.feature - first
                n_feats = s_len.shape[1]
                seg_len.append(s_len[slot.bucket, k])
                seg_val.append(s_vals[slot.bucket * n_feats + k])
                if s_wts is not None:
                    seg_wt.append(s_wts[slot.bucket * n_feats + k])
            else:
                seg_len.append(lengths[slot.feature])
                seg_val.append(values_f[slot.feature])
                if weights_f is not None:
                    seg_wt.append(weights_f[slot.feature])
        out_len.append(torch.cat(seg_len) if seg_len else empty_len)
        out_val.append(torch.cat(seg_val) if seg_val else values.new_zeros(0))
        if out_wt is not None:
            out_wt.append(torch.cat(seg_wt) if seg_wt else weights.new_zeros(0))  # type: ignore[union-attr]
    return RoutedInput(out_len, out_val, out_wt)


def _uniform_row_wise_blocks(layout: GroupLayout) -> list[int] | None:
    """Per feature, its table's block size, when every table is cut into one block per rank
    in rank order (plain row-wise); None otherwise."""
    cached = getattr(layout, "_row_wise_sizes", False)
    if cached is not False:
        return cached  # type: ignore[no-any-return,return-value]
    sizes: list[int] | None = []
    world = layout.world_size
    for t, table in enumerate(layout.tables):
        blocks = layout.row_blocks[t]
        size = uniform_block_size(blocks, table.num_embeddings)
        ranks = sorted((s.row_offset, s.rank) for r in range(world)
                       for tt, s in layout.local_tables[r] if tt == t)
        if size is None or len(blocks) != world or [r for _, r in ranks] != list(range(world)):
            sizes = None
            break
        sizes += [size] * len(table.feature_names)  # type: ignore[operator]
    layout._row_wise_sizes = sizes  # type: ignore[attr-defined]
    return sizes


def _route_row_wise(
    layout: GroupLayout,
    sizes: list[int],
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: torch.Tensor | None,
) -> RoutedInput:
    """:func:`route` for plain row-wise: one bucketize of every feature; bucket r is rank r's."""
    world = layout.world_size
    block_sizes = torch.tensor(sizes, dtype=values.dtype)
    new_lengths, new_values, new_weights, _, _ = (
        torch.ops.fbgemm.block_bucketize_sparse_features(
            lengths.reshape(-1), values, False, False, block_sizes, world, weights))
    per_rank = new_lengths.view(world, -1)
    counts = per_rank.sum(dim=1).tolist()
    return RoutedInput(list(per_rank.unbind(0)), list(new_values.split(counts)),
                       list(new_weights.split(counts)) if new_weights is not None else None)


def route_whole_features(
    layout: GroupLayout,
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: torch.Tensor | None,
) -> RoutedInput:
    """:func:`route` when no table is cut by rows: each slot is a whole feature, so one
    permutation of the features (slot order over all ranks) then a split does it."""
    order = [s.feature for rank in range(layout.world_size) for s in layout.slots_per_rank[rank]]
    perm = torch.tensor(order, dtype=torch.long, device=lengths.device)
    p_len, p_val, p_wt = permute_2d_sparse(perm, lengths, values, weights)
    slots = [len(layout.slots_per_rank[r]) for r in range(layout.world_size)]
    per_rank_values = p_len.view(len(order), -1).sum(dim=1).split(slots)
    value_counts = [int(v.sum()) for v in per_rank_values]
    out_len = list(p_len.reshape(-1).split([n * lengths.shape[1] for n in slots]))
    return RoutedInput(out_len, list(p_val.split(value_counts)),
                       list(p_wt.split(value_counts)) if p_wt is not None else None)


# ---- receiver side: source-major -> slot-major -----------------------------------------------
def to_slot_major(
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: torch.Tensor | None,
    num_slots: int,
    batch_per_source: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Reorder received bags from (source, slot, sample) to (slot, source, sample).

    After this each slot holds the bags of the global batch (sources in rank order), so the
    embedding kernel sees ``num_slots`` features over ``sum(batch_per_source)`` samples.
    """
    world = len(batch_per_source)
    if world == 1 or num_slots <= 1:
        return lengths, values, weights
    if len(set(batch_per_source)) == 1:
        # equal batches: a (source x slot, B) jagged block; permute its rows slot-major
        order = torch.arange(world * num_slots, device=lengths.device)
        order = order.view(world, num_slots).t().reshape(-1)
        new_lengths, new_values, new_weights = permute_2d_sparse(
            order, lengths.view(world * num_slots, -1), values, weights)
        return new_lengths.reshape(-1), new_values, new_weights
    # segments are (source, slot) blocks of bags; we want them in (slot, source) order
    device = lengths.device
    seg_bags = torch.tensor([b for b in batch_per_source for _ in range(num_slots)],
                            device=device)
    order = torch.arange(world * num_slots, device=device).view(world, num_slots).t().reshape(-1)
    bag_offsets = complete_cumsum(seg_bags)
    bag_index = segment_ranges(bag_offsets, order, order + 1)
    new_lengths = lengths[bag_index]
    value_offsets = complete_cumsum(lengths.long())
    seg_values = value_offsets[bag_offsets[1:]] - value_offsets[bag_offsets[:-1]]
    value_index = segment_ranges(complete_cumsum(seg_values), order, order + 1)
    return (new_lengths, values[value_index],
            weights[value_index] if weights is not None else None)

