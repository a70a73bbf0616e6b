"""Collectives for sharded embeddings, with timeouts, autograd and failures that name a rank.

Three kinds of exchange move data between the ranks of a sharded model:

* the **jagged all-to-all** of the input distribution (:func:`jagged_all_to_all`): each rank
  sends every other rank some bags (lengths) and their ids (values), unequal in size, so it
  runs as ``all_to_all_single`` with split sizes (gloo's list ``all_to_all`` refuses unequal
  tensors): first the split sizes, then lengths and values together;
* the **pooled all-to-all** of the output distribution (:func:`pooled_all_to_all`): the pooled
  embeddings a rank computed for every source rank's samples go back to their source; its
  backward is the reverse all-to-all of the gradients;
* the **reduce-scatter** of row-wise partial sums (:func:`reduce_scatter_rows`), whose backward
  is an all-gather.

Every collective runs inside :func:`collective`, which turns a gloo/NCCL failure (a timeout, a
peer that closed its connection) into a :class:`~ctrctl.errors.DistributedError` that names
the rank(s) at fault. A rank that fails on its own (an exception in its code) says so through
:func:`fail_fast`: it writes its rank and message to the rendezvous store before it exits, so
the others report *that* rank rather than a bare timeout.

Example:
    >>> with fail_fast():                      # in each rank's training code
    ...     out = pooled_all_to_all(emb, batch_sizes, widths)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# The process groups and the failure handling live beside: re-exported, so ``comm.X`` names
# every piece of the collectives' API.
from ctrctl.distributed.comm.failures import (  # noqa: F401
    ROLL_CALL_S,
    collective,
    diagnose,
    fail_fast,
    failed_ranks,
    mark_failed,
    rank_guard,
)
from ctrctl.distributed.comm.groups import (  # noqa: F401
    DEFAULT_TIMEOUT,
    ProcessGroup,
    default_backend,
    group_timeout,
    init_process_group,
    new_group,
)
from ctrctl.errors import DistributedError
from ctrctl.modules.native.buffers import ReusableBuffer, reusable_empty

logger = logging.getLogger(__name__)



# torch 2.13 renames the tensor forms (the old names warn); older torch has only the old ones.
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
_all_gather_tensor = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)


# ---- jagged all-to-all (input distribution) --------------------------------------------------
@dataclass
class JaggedExchange:
    """What a rank received in a jagged all-to-all, per source rank.

    Attributes:
        lengths: the bag lengths from every source, concatenated in source order.
        values: the ids from every source, concatenated in source order.
        weights: per-id weights, when sent.
        lengths_per_source: how many lengths each source sent.
        values_per_source: how many values each source sent.
        batch_per_source: each source's local batch size.
    """

    lengths: torch.Tensor
    values: torch.Tensor
    weights: torch.Tensor | None
    lengths_per_source: list[int]
    values_per_source: list[int]
    batch_per_source: list[int]


def jagged_all_to_all(
    lengths: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor] | None,
    batch_size: int,
    group: ProcessGroup | None = None,
) -> JaggedExchange:
    """Send ``lengths[r]``/``values[r]`` (and ``weights[r]``) to rank ``r``; receive the same.

    Step one exchanges the split sizes (and each rank's batch size) as a small
    ``all_to_all_single``; step two sends lengths and values (and weights) at once, each an
    ``all_to_all_single`` with those split sizes. :func:`start_jagged_all_to_all` is the
    same exchange by halves, for a train pipeline that overlaps it with compute.

    Args:
        lengths: one 1-D integer tensor per destination rank.
        values: one 1-D id tensor per destination rank.
        weights: one 1-D float tensor per destination rank, or None.
        batch_size: this rank's local batch size (sent along so receivers know every B).
        group: the process group (default: the world).

    Returns:
        A :class:`JaggedExchange` with what every source sent here.
    """
    return start_jagged_all_to_all(lengths, values, weights, batch_size, group).wait().wait()


class JaggedSplits:
    """The first half of a jagged all-to-all: the split sizes, in flight.

    :meth:`wait` waits for them and launches the second half (lengths, values and weights),
    returning it as a :class:`JaggedData` to wait on later.
    """

    def __init__(self, send_lengths: torch.Tensor, send_values: torch.Tensor,
                 send_weights: torch.Tensor | None, send_sizes: torch.Tensor,
                 group: ProcessGroup | None) -> None:
        self._send = (send_lengths, send_values, send_weights)
        self._send_sizes = send_sizes
        self._recv_sizes = torch.empty_like(send_sizes)
        self._group = group
        with collective("input distribution (split sizes)"):
            self._work = dist.all_to_all_single(self._recv_sizes, send_sizes, group=group,
                                                async_op=True)

    def wait(self) -> JaggedData:
        """Wait for the split sizes; launch the data exchange (returns at once)."""
        with collective("input distribution (split sizes)"):
            self._work.wait()
        send_lengths, send_values, send_weights = self._send
        send_sizes, recv_sizes, group = self._send_sizes, self._recv_sizes, self._group
        in_len, in_val = send_sizes[:, 0].tolist(), send_sizes[:, 1].tolist()
        out_len, out_val = recv_sizes[:, 0].tolist(), recv_sizes[:, 1].tolist()
        recv_lengths = send_lengths.new_empty(sum(out_len))
        recv_values = send_values.new_empty(sum(out_val))
        recv_weights = None
        with collective("input distribution (lengths and values)"):
            works = [
                dist.all_to_all_single(recv_lengths, send_lengths, out_len, in_len,
                                       group=group, async_op=True),
                dist.all_to_all_single(recv_values, send_values, out_val, in_val,
                                       group=group, async_op=True),
            ]
            if send_weights is not None:
                recv_weights = send_weights.new_empty(sum(out_val))
                works.append(dist.all_to_all_single(recv_weights, send_weights, out_val,
                                                    in_val, group=group, async_op=True))
        exchange = JaggedExchange(recv_lengths, recv_values, recv_weights, out_len, out_val,
                                  recv_sizes[:, 2].tolist())
        return JaggedData(exchange, works)


class JaggedData:
    """The second half of a jagged all-to-all in flight; :meth:`wait` gives what arrived."""

    def __init__(self, exchange: JaggedExchange, works: list[Any]) -> None:
        self._exchange, self._works = exchange, works

    def wait(self) -> JaggedExchange:
        with collective("input distribution (lengths and values)"):
            while self._works:
                self._works.pop().wait()
        return self._exchange


def start_jagged_all_to_all(
    lengths: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor] | None,
    batch_size: int,
    group: ProcessGroup | None = None,
) -> JaggedSplits:
    """Launch a jagged all-to-all's split-size exchange; see :func:`jagged_all_to_all`.

    Every rank must start its exchanges in the same order (they are matched by order).

    Example:
        >>> splits = start_jagged_all_to_all(lengths, values, None, batch)   # returns at once
        >>> data = splits.wait()            # sizes known; lengths and values now in flight
        >>> received = data.wait()          # a JaggedExchange
    """
    world = dist.get_world_size(group)
    if len(lengths) != world or len(values) != world:
        raise DistributedError(f"jagged_all_to_all needs one tensor per rank ({world})",
                               where="jagged_all_to_all")
    send_sizes = torch.tensor([[t.numel(), v.numel(), batch_size]
                               for t, v in zip(lengths, values, strict=True)], dtype=torch.int64,
                              device=values[0].device if values else None)
    send_weights = torch.cat(list(weights)) if weights is not None else None
    return JaggedSplits(torch.cat(list(lengths)), torch.cat(list(values)), send_weights,
                        send_sizes, group)


# ---- output distribution buffers -------------------------------------------------------------
class OutputDistBuffers:
    """The memory one output distribution reuses step after step (see
    :mod:`ctrctl.modules.native.buffers`: fresh tens of MB cost tens of ms in page faults here).

    One per call site (a sharding group's ``output_dist``): forward's receive buffer and
    output, backward's send buffer and gradient. Each is handed out again only when nothing
    holds it, so a pipeline that keeps a batch's output alive gets new memory instead.
    """

    def __init__(self) -> None:
        self.forward_recv = ReusableBuffer()
        self.forward_out = ReusableBuffer()
        self.backward_send = ReusableBuffer()
        self.backward_out = ReusableBuffer()


def _is_gloo(group: ProcessGroup | None) -> bool:
    return bool(dist.get_backend(group) == "gloo")


# ---- pooled all-to-all (output distribution) -------------------------------------------------
#: Where a block's columns go: (column in the block, column in the output, width).
ColumnRun = tuple[int, int, int]


def column_runs(targets: Sequence[int]) -> list[ColumnRun]:
    """The output columns of a block's columns, ``targets[c]`` for column c, as runs of
    consecutive columns: one slice copy per run instead of a gather per column.

    Example:
        >>> column_runs([4, 5, 6, 0, 1])
        [(0, 4, 3), (3, 0, 2)]
    """
    runs: list[ColumnRun] = []
    for c, t in enumerate(targets):
        if runs and runs[-1][1] + runs[-1][2] == t:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((c, t, 1))
    return runs


class _PooledAllToAll(torch.autograd.Function):
    """Forward: rows of each source go home. Backward: their gradients come back.

    With a ``placement`` (output width, each rank's :func:`column_runs`) the received blocks
    are copied straight to their output columns, and backward gathers each rank's columns
    straight into its send buffer: one pass over the embeddings each way, where placing
    the blocks side by side and permuting the columns after takes two (forward) and three
    (backward: a zero fill, a scatter-add and a concatenation). The same values either way.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, local: torch.Tensor, batch_per_rank: list[int], width_per_rank: list[int],
        group: ProcessGroup | None, grad_scale: float,
        placement: tuple[int, list[list[ColumnRun]]] | None,
        buffers: OutputDistBuffers | None,
    ) -> torch.Tensor:
        me = dist.get_rank(group)
        width = local.size(1)
        in_splits = [b * width for b in batch_per_rank]
        out_splits = [batch_per_rank[me] * w for w in width_per_rank]
        flat = local.contiguous().view(-1)
        out = reusable_empty(buffers.forward_recv if buffers else None, (sum(out_splits),), flat)
        with collective("output distribution (pooled all-to-all)"):
            dist.all_to_all_single(out, flat, out_splits, in_splits, group=group)
        ctx.save_for_backward()
        batch = batch_per_rank[me]
        ctx.meta = (in_splits, out_splits, local.shape, group, grad_scale, batch,
                    width_per_rank, placement, buffers)
        blocks = [b.view(batch, w) for b, w in
                  zip(out.split(out_splits), width_per_rank, strict=True)]
        if placement is None:  # (B_me, W_r) from each rank r, side by side: (B_me, sum_r W_r)
            return torch.cat(blocks, dim=1)
        out_width, runs = placement
        placed = reusable_empty(buffers.forward_out if buffers else None, (batch, out_width), out)
        for block, block_runs in zip(blocks, runs, strict=True):
            for source, target, w in block_runs:
                placed[:, target : target + w].copy_(block[:, source : source + w])
        return placed

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        (in_splits, out_splits, shape, group, grad_scale, batch, widths, placement,
         buffers) = ctx.meta
        if placement is None:
            send = torch.cat([p.contiguous().view(-1) for p in grad.split(widths, dim=1)])
        else:
            send = reusable_empty(buffers.backward_send if buffers else None,
                                  (sum(out_splits),), grad)
            for piece, w, block_runs in zip(send.split(out_splits), widths, placement[1],
                                            strict=True):
                block = piece.view(batch, w)
                for source, target, n in block_runs:
                    block[:, source : source + n].copy_(grad[:, target : target + n])
        recv = reusable_empty(buffers.backward_out if buffers else None, (sum(in_splits),), send)
        with collective("backward of the output distribution (pooled all-to-all)"):
            dist.all_to_all_single(recv, send, in_splits, out_splits, group=group)
        recv = recv.view(shape)
        if grad_scale != 1.0:
            recv.mul_(grad_scale)  # ours: scaled in place, no second buffer
        return recv, None, None, None, None, None, None


def pooled_all_to_all(
    local: torch.Tensor,
    batch_per_rank: Sequence[int],
    width_per_rank: Sequence[int],
    group: ProcessGroup | None = None,
    grad_scale: float = 1.0,
    placement: tuple[int, list[list[ColumnRun]]] | None = None,
    buffers: OutputDistBuffers | None = None,
) -> torch.Tensor:
    """Return each source rank its rows of the pooled embeddings computed here.

    Args:
        local: (sum of all ranks' batches, W_me): rows grouped by source rank, in rank order.
        batch_per_rank: every rank's local batch size.
        width_per_rank: every rank's W (the width of its ``local``).
        group: the process group.
        grad_scale: factor applied to the gradient on its way back (1 / world size for
            gradient division, see :class:`~ctrctl.distributed.embeddingbag.ShardedEmbeddingBagCollection`).
        placement: (output width D, per rank the :func:`column_runs` of its block's output
            columns) when the blocks tile the output exactly once: the result is then the
            (B_me, D) output itself, columns in place.
        buffers: the call site's :class:`OutputDistBuffers` (memory reused between steps).

    Returns:
        (B_me, sum of W over ranks): the blocks of every rank side by side, in rank order;
        with a ``placement``, (B_me, D) with every block's columns where the runs say.
    """
    return _PooledAllToAll.apply(local, list(batch_per_rank), list(width_per_rank), group,
                                 grad_scale, placement, buffers)


# ---- reduce-scatter (row-wise output distribution) -------------------------------------------
class _ReduceScatterRows(torch.autograd.Function):
    """Forward: sum partials over ranks, keep my rows. Backward: all-gather the gradients.

    On gloo both run as one ``all_to_all_single`` (plus the local sum, or the copies of the
    gradient to send): gloo's own reduce-scatter and all-gather move the same bytes several
    times slower (measured at world size 2, 54 MB of partials: 83 ms against 23 ms for the
    all-to-all into a reused buffer). NCCL keeps its reduce-scatter and all-gather.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, partial: torch.Tensor, batch_per_rank: list[int], group: ProcessGroup | None,
        grad_scale: float, buffers: OutputDistBuffers | None,
    ) -> torch.Tensor:
        me = dist.get_rank(group)
        ctx.meta = (batch_per_rank, group, grad_scale, buffers)
        partial = partial.contiguous()
        width = partial.size(1)
        if len(set(batch_per_rank)) == 1 and not _is_gloo(group):
            out = partial.new_empty(batch_per_rank[me], width)
            with collective("output distribution (reduce-scatter)"):
                _reduce_scatter_tensor(out, partial, group=group)
            return out
        # The same sum as an all-to-all of rows plus a local sum, in rank order.
        in_splits = [b * width for b in batch_per_rank]
        world = len(batch_per_rank)
        recv = reusable_empty(buffers.forward_recv if buffers else None,
                              (world * batch_per_rank[me] * width,), partial)
        with collective("output distribution (reduce-scatter)"):
            dist.all_to_all_single(recv, partial.view(-1), [in_splits[me]] * world, in_splits,
                                   group=group)
        parts = recv.view(world, batch_per_rank[me], width)
        out = reusable_empty(buffers.forward_out if buffers else None,
                             (batch_per_rank[me], width), partial)
        torch.sum(parts, dim=0, out=out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        batch_per_rank, group, grad_scale, buffers = ctx.meta
        width = grad.size(1)
        if len(set(batch_per_rank)) == 1 and not _is_gloo(group):
            # Scaled before the gather (the same products, on 1 / world of the rows), which
            # also makes it contiguous.
            grad = grad * grad_scale if grad_scale != 1.0 else grad.contiguous()
            full = grad.new_empty(sum(batch_per_rank), width)
            with collective("backward of the output distribution (all-gather)"):
                _all_gather_tensor(full, grad, group=group)
            return full, None, None, None, None
        me = dist.get_rank(group)
        world = len(batch_per_rank)
        out_splits = [b * width for b in batch_per_rank]
        mine = batch_per_rank[me] * width
        send = reusable_empty(buffers.backward_send if buffers else None,
                              (world, batch_per_rank[me], width), grad)
        for r in range(world):  # my rows' gradient for every rank, scaled on the way
            if grad_scale != 1.0:
                torch.mul(grad, grad_scale, out=send[r])
            else:
                send[r].copy_(grad)
        full = reusable_empty(buffers.backward_out if buffers else None, (sum(out_splits),), grad)
        with collective("backward of the output distribution (all-gather)"):
            dist.all_to_all_single(full, send.view(-1), out_splits, [mine] * world,
                                   group=group)
        return full.view(-1, width), None, None, None, None


def reduce_scatter_rows(
    partial: torch.Tensor,
    batch_per_rank: Sequence[int],
    group: ProcessGroup | None = None,
    grad_scale: float = 1.0,
    buffers: OutputDistBuffers | None = None,
) -> torch.Tensor:
    """Sum (sum of batches, D) partials over ranks; each rank keeps its own rows (B_me, D).

    NCCL with equal batches uses ``reduce_scatter_tensor`` (backward:
    ``all_gather_into_tensor``); gloo, and unequal batches, the same sum through an
    all-to-all. ``buffers``: the call site's :class:`OutputDistBuffers`.
    """
    return _ReduceScatterRows.apply(partial, list(batch_per_rank), group, grad_scale, buffers)


def all_reduce_(tensor: torch.Tensor, group: ProcessGroup | None = None,
                average: bool = False) -> torch.Tensor:
    """In-place all-reduce (sum, or mean with ``average``) inside :func:`collective`."""
    with collective("all-reduce"):
        dist.all_reduce(tensor, group=group)
    if average:
        tensor.div_(dist.get_world_size(group))
    return tensor
