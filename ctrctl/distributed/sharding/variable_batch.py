"""Deduplicated lookups through a routed sharding group: a variable batch per feature.

The plain path (:mod:`ctrctl.distributed.sharding.routed`) sends every sample's bag of every
feature, pools the global batch and returns (B, D) pooled rows per rank. Here each feature ``f``
of this rank carries only its ``U_f`` distinct bags (:func:`ctrctl.sparse.dedup.deduplicate`):

1. **input**: per destination rank, its slots' distinct bags, with the bag count of each slot
   sent ahead of the lengths (one header entry per slot: no extra collective);
2. **lookup**: each slot pools the distinct bags of every source (``sum_q U_{f,q}`` bags; a run
   of slots shares one kernel call, padded with empty bags to its longest slot);
3. **output**: each source gets back ``U_f`` rows per slot through one all-to-all of variable
   sizes (its backward is the reverse all-to-all); row blocks of a feature (row-wise partial
   sums) are added in rank order, column blocks placed side by side;
4. **expand**: ``inverse_indices`` put the (U_f, D_f) rows back in batch order (B, D_f). Its
   backward sums the gradients of the samples that share a bag, so the fused optimizer sees
   each distinct bag (and each row) once.

Shapes on a rank with this group's features F, slots S, world W::

    lengths (sum_f U_f,), ids   -- route --> per rank r: [U of each of r's slots | lengths]
    received per slot s: bags of every source  -- lookup -->  (sum_q U_{s,q}, cols_s)
    all-to-all (variable)       -->  per feature (U_f, D_f)  -- expand -->  (B, D)

Example:
    >>> d = deduplicate(kjt)                          # one group's features
    >>> pending = start_dedup_input_dist(tw, DedupInput.from_kjt(d))
    >>> out = dedup_output_dist(tw, dedup_lookup(tw, pending.wait()), pending.wait())  # (B, D)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

from ctrctl.distributed import comm
from ctrctl.distributed.sharding.base import PendingInput
from ctrctl.modules.native.buffers import ReusableBuffer, reusable_empty
from ctrctl.sparse.jagged_tensor import KeyedJaggedTensor
from ctrctl.sparse.ops import complete_cumsum, segment_ranges

if TYPE_CHECKING:
    from ctrctl.distributed.sharding.routed import RoutedSharding


@dataclass
class DedupInput:
    """One group's features of a deduplicated batch, on this rank.

    Attributes:
        lengths: (sum of strides,) distinct bags' lengths, feature after feature.
        values: their ids.
        weights: their per-id weights, or None.
        strides: per feature, its distinct bag count ``U_f``.
        inverse: (F, B): ``inverse[f, b]`` is sample b's bag among feature f's.
        kept: per feature, whether it kept every sample's bag in batch order (``inverse[f]``
            is ``0 .. B-1``: nothing to expand).
    """

    lengths: torch.Tensor
    values: torch.Tensor
    weights: torch.Tensor | None
    strides: list[int]
    inverse: torch.Tensor
    kept: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.kept:
            batch = self.inverse.shape[1]
            every = torch.arange(batch, device=self.inverse.device)
            self.kept = [n == batch and bool(torch.equal(inv, every))
                         for n, inv in zip(self.strides, self.inverse, strict=True)]

    @staticmethod
    def from_kjt(kjt: KeyedJaggedTensor, keys: Sequence[str]) -> DedupInput:
        """The features ``keys`` (in that order) of a :func:`deduplicate` result."""
        index = kjt.index_per_key()
        strides_all = kjt.stride_per_key()
        bag_off = [0]
        for s in strides_all:
            bag_off.append(bag_off[-1] + s)
        val_off = kjt.offset_per_key()
        lengths, values, weights = kjt.lengths(), kjt.values(), kjt.weights_or_none()
        ks = [index[k] for k in keys]
        if ks == list(range(len(strides_all))):
            return DedupInput(lengths, values, weights, strides_all, kjt.inverse_indices()[1])
        pick = [(bag_off[k], bag_off[k + 1], val_off[k], val_off[k + 1]) for k in ks]
        return DedupInput(
            torch.cat([lengths[a:b] for a, b, _, _ in pick]),
            torch.cat([values[a:b] for _, _, a, b in pick]),
            torch.cat([weights[a:b] for _, _, a, b in pick]) if weights is not None else None,
            [strides_all[k] for k in ks],
            kjt.inverse_indices()[1][ks])


@dataclass
class VariableExchange:
    """What a rank received: its slots' bags from every source, slot-major.

    Attributes:
        lengths, values, weights: slot after slot, within a slot source after source.
        bags: ``bags[q][s]``: the bags source q sent for slot s.
        local: this rank's own :class:`DedupInput` (the output dist needs it).
    """

    lengths: torch.Tensor
    values: torch.Tensor
    weights: torch.Tensor | None
    bags: list[list[int]]
    local: DedupInput


class PendingDedupExchange(PendingInput[VariableExchange]):
    """A deduplicated input dist in flight (split sizes first, then the data)."""

    def __init__(self, splits: comm.JaggedSplits, num_slots: int, local: DedupInput) -> None:
        self._splits: comm.JaggedSplits | None = splits
        self._data: comm.JaggedData | None = None
        self._num_slots = num_slots
        self._local = local
        self._received: VariableExchange | None = None

    def launch(self) -> None:
        if self._splits is not None:
            self._data, self._splits = self._splits.wait(), None

    def wait(self) -> VariableExchange:
        if self._received is None:
            self.launch()
            assert self._data is not None
            self._received = _unpack(self._data.wait(), self._num_slots, self._local)
        return self._received


# ---- stage 1 ---------------------------------------------------------------------------------
def _bucketize(lengths: torch.Tensor, values: torch.Tensor, weights: torch.Tensor | None,
               blocks: Sequence[tuple[int, int]]
               ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor] | None]:
    """One feature's bags split by row block: (n_blocks, bags) lengths, block-local ids per
    block (ids keep their order within a bag), weights likewise."""
    n, bags = len(blocks), lengths.numel()
    starts = torch.tensor([b[0] for b in blocks], dtype=values.dtype, device=values.device)
    bucket = torch.searchsorted(starts, values, right=True) - 1
    bag = torch.repeat_interleave(torch.arange(bags, device=values.device), lengths.long())
    key = bucket * bags + bag
    order = torch.argsort(key, stable=True)
    new_values = values[order] - starts[bucket[order]]
    new_lengths = torch.bincount(key, minlength=n * bags).to(lengths.dtype).view(n, bags)
    counts = new_lengths.sum(dim=1).tolist()
    return (new_lengths, list(new_values.split(counts)),
            list(weights[order].split(counts)) if weights is not None else None)


def start_dedup_input_dist(group: RoutedSharding, local: DedupInput
                           ) -> PendingDedupExchange:
    """Route each feature's distinct bags to the slots that pool them; start the exchange."""
    layout = group.layout
    bag_off = [0]
    for s in local.strides:
        bag_off.append(bag_off[-1] + s)
    val_off = complete_cumsum(local.lengths.long())[torch.tensor(bag_off)].tolist()
    per_feature = []
    for f, (_, t) in enumerate(layout.features):
        lens = local.lengths[bag_off[f]:bag_off[f + 1]]
        vals = local.values[val_off[f]:val_off[f + 1]]
        wts = local.weights[val_off[f]:val_off[f + 1]] if local.weights is not None else None
        if layout.row_split(t):
            per_feature.append(_bucketize(lens, vals, wts, layout.row_blocks[t]))
        else:
            per_feature.append((lens.unsqueeze(0), [vals], [wts] if wts is not None else None))
    send_len, send_val, send_wt = [], [], []
    for rank in range(layout.world_size):
        slots = layout.slots_per_rank[rank]
        header = local.lengths.new_tensor([local.strides[s.feature] for s in slots])
        seg_len, seg_val, seg_wt = [header], [], []
        for slot in slots:
            b_len, b_val, b_wt = per_feature[slot.feature]
            seg_len.append(b_len[slot.bucket])
            seg_val.append(b_val[slot.bucket])
            if b_wt is not None:
                seg_wt.append(b_wt[slot.bucket])
        send_len.append(torch.cat(seg_len))
        send_val.append(torch.cat(seg_val) if seg_val else local.values.new_zeros(0))
        if local.weights is not None:
            send_wt.append(torch.cat(seg_wt) if seg_wt else local.weights.new_zeros(0))
    splits = comm.start_jagged_all_to_all(send_len, send_val,
                                          send_wt if local.weights is not None else None,
                                          local.inverse.shape[1], group.group)
    return PendingDedupExchange(splits, len(layout.slots_per_rank[group.rank]), local)


def _unpack(received: comm.JaggedExchange, num_slots: int, local: DedupInput
            ) -> VariableExchange:
    """Strip each source's header (its bag count per slot); order bags slot-major."""
    world = len(received.lengths_per_source)
    pieces = received.lengths.split(received.lengths_per_source)
    bags = [p[:num_slots].tolist() for p in pieces]
    lengths = torch.cat([p[num_slots:] for p in pieces]) if pieces else received.lengths
    if world == 1 or num_slots <= 1:
        return VariableExchange(lengths, received.values, received.weights, bags, local)
    device = lengths.device
    seg_bags = torch.tensor([b for per_source in bags for b in per_source], device=device)
    order = torch.arange(world * num_slots, device=device).view(world, num_slots).t().reshape(-1)
    bag_offsets = complete_cumsum(seg_bags)
    new_lengths = lengths[segment_ranges(bag_offsets, order, order + 1)]
    value_offsets = complete_cumsum(lengths.long())
    seg_values = value_offsets[bag_offsets[1:]] - value_offsets[bag_offsets[:-1]]
    value_index = segment_ranges(complete_cumsum(seg_values), order, order + 1)
    weights = received.weights[value_index] if received.weights is not None else None
    return VariableExchange(new_lengths, received.values[value_index], weights, bags, local)


# ---- stage 2 ---------------------------------------------------------------------------------
@dataclass
class PooledSlots:
    """The lookup's output: each run's (rows, W_run) block flattened, one after another.

    Attributes:
        flat: the blocks, flattened and concatenated.
        base: per slot, where its run's block starts in ``flat``.
        width: per slot, its run's row width W_run.
        column: per slot, its first column within its run's block.
        rows: per slot, its run's block's row count (its longest slot's bags).
    """

    flat: torch.Tensor
    base: list[int]
    width: list[int]
    column: list[int]
    rows: list[int]


def dedup_lookup(group: RoutedSharding, received: VariableExchange) -> PooledSlots:
    """Pool the bags received: slot s of a run holds rows 0 .. (its bags from every
    source) - 1 of its run's block, in its columns."""
    slots = group.layout.slots_per_rank[group.rank]
    per_slot = [sum(per_source[s] for per_source in received.bags) for s in range(len(slots))]
    value_offsets = complete_cumsum(received.lengths.long())
    bag_start = [0]
    for n in per_slot:
        bag_start.append(bag_start[-1] + n)
    blocks: list[torch.Tensor] = []
    base, width, column, rows = [], [], [], []
    offset = 0
    for (s0, s1, _, _), kernel in zip(group.runs, group.kernels(), strict=True):
        counts = per_slot[s0:s1]
        widest = max(counts)
        run_width = sum(slots[s].shard.cols for s in range(s0, s1))
        col = 0
        for s in range(s0, s1):
            base.append(offset)
            width.append(run_width)
            column.append(col)
            rows.append(widest)
            col += slots[s].shard.cols
        if widest == 0:                    # no bags at all: nothing to pool or to update
            continue
        lens = received.lengths[bag_start[s0]:bag_start[s1]]
        v0, v1 = int(value_offsets[bag_start[s0]]), int(value_offsets[bag_start[s1]])
        # slots of unequal bag counts share a kernel: pad each with empty bags to the widest
        padded = lens.new_zeros(s1 - s0, widest)
        count_t = torch.tensor(counts, device=lens.device)
        slot_of = torch.repeat_interleave(torch.arange(s1 - s0, device=lens.device), count_t)
        within = torch.arange(lens.numel(), device=lens.device) - complete_cumsum(count_t)[slot_of]
        padded.view(-1)[slot_of * widest + within] = lens
        weights = received.weights[v0:v1] if received.weights is not None else None
        out = kernel(received.values[v0:v1], complete_cumsum(padded.view(-1).long()), weights)
        blocks.append(out.reshape(-1))                                     # (widest * W_run,)
        offset += out.numel()
    if not blocks:   # nothing pooled here: still take part in backward's collective
        flat = torch.zeros(0, device=received.values.device,
                           requires_grad=torch.is_grad_enabled())
    else:
        flat = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
    return PooledSlots(flat, base, width, column, rows)


# ---- stage 3 ---------------------------------------------------------------------------------
class DedupBuffers:
    """The memory one group's deduplicated output dist reuses step after step (fresh tens
    of MB cost tens of ms in page faults on the CPU; see
    :class:`~ctrctl.distributed.comm.OutputDistBuffers`)."""

    def __init__(self) -> None:
        self.send, self.recv, self.out = ReusableBuffer(), ReusableBuffer(), ReusableBuffer()
        self.grad_out, self.grad_recv = ReusableBuffer(), ReusableBuffer()
        self.grad_flat = ReusableBuffer()


def dedup_buffers(group: RoutedSharding) -> DedupBuffers:
    """The group's :class:`DedupBuffers` (made on first use)."""
    buffers = group.__dict__.get("_dedup_buffers")
    if buffers is None:
        buffers = group.__dict__["_dedup_buffers"] = DedupBuffers()
    return cast(DedupBuffers, buffers)


class _Pack(torch.autograd.Function):
    """The send buffer: blocks ``(rows, cols)`` cut out of the lookup's output, one after
    another. Backward copies each gradient block back into place (rows no source asked for
    are padding: their gradient is zero)."""

    @staticmethod
    def forward(ctx: Any, flat: torch.Tensor, cuts: list[tuple[int, int, int, int, int]],  # type: ignore[override]
                total: int, padding: list[tuple[int, int, int, int]],
                buffers: DedupBuffers) -> torch.Tensor:
        send = reusable_empty(buffers.send, (total,), flat)
        at = 0
        for first, rows, cols, width, _ in cuts:    # first element, rows, cols, row stride
            block = flat.as_strided((rows, cols), (width, 1), flat.storage_offset() + first)
            send[at:at + rows * cols].view(rows, cols).copy_(block)
            at += rows * cols
        ctx.meta = (flat.numel(), cuts, padding, buffers)
        return send

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        size, cuts, padding, buffers = ctx.meta
        # every element is a cut's or padding's: no full fill
        out = reusable_empty(buffers.grad_flat, (size,), grad)
        at = 0
        for first, rows, cols, width, _ in cuts:
            out.as_strided((rows, cols), (width, 1), first).copy_(
                grad[at:at + rows * cols].view(rows, cols))
            at += rows * cols
        for first, rows, cols, width in padding:
            out.as_strided((rows, cols), (width, 1), first).zero_()
        return out, None, None, None, None


@dataclass
class _FeaturePlan:
    """Where one feature's pooled rows sit in the received buffer, and how they expand.

    Attributes:
        start: the feature's first output column.
        rows: its rows in the buffer: its distinct bags (the batch when it kept every bag).
        blocks: per column block (first column in the feature, cols, the offsets in the
            received buffer of its row blocks' (U, cols) partial sums, in rank order).
        inverse: (B,) sample -> distinct bag, or None when the feature kept every bag.
        scale: (U,) factors of a mean over row blocks (1 / bag length), or None.
    """

    start: int
    rows: int
    blocks: list[tuple[int, int, list[int]]]
    inverse: torch.Tensor | None
    scale: torch.Tensor | None


class _Unpack(torch.autograd.Function):
    """Received buffer -> (B, D): per feature, its column blocks (row blocks summed in rank
    order, a mean scaled), each sample's distinct bag written in place. Backward writes
    each block's gradient straight into the buffer's layout, summing over the samples that
    share a bag (so the lookup's backward sees each distinct bag once)."""

    @staticmethod
    def forward(ctx: Any, recv: torch.Tensor, plans: list[_FeaturePlan],  # type: ignore[override]
                batch: int, width: int, buffers: DedupBuffers) -> torch.Tensor:
        out = reusable_empty(buffers.out, (batch, width), recv)
        for plan in plans:
            u = plan.rows
            for col, cols, parts in plan.blocks:
                rows = recv[parts[0]:parts[0] + u * cols].view(u, cols)
                for o in parts[1:]:
                    rows = rows + recv[o:o + u * cols].view(u, cols)
                if plan.scale is not None:
                    rows = rows * plan.scale.unsqueeze(1)
                target = out[:, plan.start + col:plan.start + col + cols]
                target.copy_(rows if plan.inverse is None else rows.index_select(0, plan.inverse))
        ctx.meta = (plans, recv.numel(), buffers)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        plans, size, buffers = ctx.meta
        # every element belongs to exactly one block: no fill
        back = reusable_empty(buffers.grad_out, (size,), grad)
        for plan in plans:
            u = plan.rows
            for col, cols, parts in plan.blocks:
                g = grad[:, plan.start + col:plan.start + col + cols]
                if plan.inverse is not None:   # contiguous: index_add_ runs 4x faster on it
                    g = g.new_zeros(u, cols).index_add_(0, plan.inverse, g.contiguous())
                if plan.scale is not None:
                    g = g * plan.scale.unsqueeze(1)
                for o in parts:
                    back[o:o + u * cols].view(u, cols).copy_(g)
        return back, None, None, None, None


class _VariableAllToAll(torch.autograd.Function):
    """A 1-D all-to-all of given split sizes; backward sends the gradients back (scaled)."""

    @staticmethod
    def forward(ctx: Any, send: torch.Tensor, in_splits: list[int],  # type: ignore[override]
                out_splits: list[int], group: Any, grad_scale: float,
                buffers: DedupBuffers) -> torch.Tensor:
        out = reusable_empty(buffers.recv, (sum(out_splits),), send)
        with comm.collective("output distribution (deduplicated all-to-all)"):
            dist.all_to_all_single(out, send.contiguous(), out_splits, in_splits, group=group)
        ctx.meta = (in_splits, out_splits, group, grad_scale, buffers)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        in_splits, out_splits, group, grad_scale, buffers = ctx.meta
        back = reusable_empty(buffers.grad_recv, (sum(in_splits),), grad)
        with comm.collective("backward of the output distribution (deduplicated all-to-all)"):
            dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=group)
        if grad_scale != 1.0:
            back.mul_(grad_scale)
        return back, None, None, None, None, None


def _cuts(group: RoutedSharding, pooled: PooledSlots, bags: list[list[int]]
          ) -> tuple[list[tuple[int, int, int, int, int]], list[int],
                     list[tuple[int, int, int, int]]]:
    """What each source gets back (its rows of every slot, slot after slot) as blocks of
    ``pooled.flat`` (first element, rows, cols, row stride, source), the element count per
    source, and the blocks no source asked for (each slot's padding rows)."""
    slots = group.layout.slots_per_rank[group.rank]
    starts = [0] * len(slots)
    cuts, sizes = [], []
    for q, per_source in enumerate(bags):
        size = 0
        for s, n in enumerate(per_source):
            cols = slots[s].shard.cols
            if n:
                first = pooled.base[s] + starts[s] * pooled.width[s] + pooled.column[s]
                cuts.append((first, n, cols, pooled.width[s], q))
            starts[s] += n
            size += n * cols
        sizes.append(size)
    padding = [(pooled.base[s] + n * pooled.width[s] + pooled.column[s], pooled.rows[s] - n,
                slots[s].shard.cols, pooled.width[s])
               for s, n in enumerate(starts) if pooled.rows[s] > n]
    return cuts, sizes, padding


def dedup_output_dist(group: RoutedSharding, pooled: PooledSlots,
                      received: VariableExchange) -> torch.Tensor:
    """Pooled distinct bags home, summed/placed per feature, expanded -> (B, D)."""
    layout, local = group.layout, received.local
    world = layout.world_size
    cuts, in_splits, padding = _cuts(group, pooled, received.bags)
    buffers = dedup_buffers(group)
    send = _Pack.apply(pooled.flat, cuts, sum(in_splits), padding, buffers)
    out_splits = [sum(local.strides[s.feature] * s.shard.cols for s in layout.slots_per_rank[r])
                  for r in range(world)]
    recv = _VariableAllToAll.apply(send, in_splits, out_splits, group.group, group.grad_scale,
                                   buffers)
    # per feature, its column blocks; a column block's row blocks (partial sums) by rank
    parts: list[dict[tuple[int, int], list[int]]] = [{} for _ in layout.features]
    at = 0
    for r in range(world):
        for slot in layout.slots_per_rank[r]:
            key = (slot.shard.col_offset, slot.shard.cols)
            parts[slot.feature].setdefault(key, []).append(at)
            at += local.strides[slot.feature] * slot.shard.cols
    bag_off = [0]
    for n in local.strides:
        bag_off.append(bag_off[-1] + n)
    plans = []
    for f, by_column in enumerate(parts):
        scale = None
        if f in group.mean_features:     # partial sums of row blocks: mean over the whole bag
            lens = local.lengths[bag_off[f]:bag_off[f + 1]].clamp(min=1).to(recv.dtype)
            scale = 1.0 / lens                       # as the plain path: times 1/length
        plans.append(_FeaturePlan(layout.feature_offsets[f], local.strides[f],
                                  [(c, w, offs) for (c, w), offs in sorted(by_column.items())],
                                  None if local.kept[f] else local.inverse[f], scale))
    return _Unpack.apply(recv, plans, local.inverse.shape[1], layout.output_dim,
                         buffers)                                               # (B, D)
