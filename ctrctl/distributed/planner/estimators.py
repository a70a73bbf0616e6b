"""The storage and cost model: bytes each shard needs and seconds it costs per step.

Per shard, with ``B`` the batch per rank, ``W`` ranks (``L`` per host), ``G = B * W`` samples
in a step, pooling factor ``P``, ``c`` columns, ``s`` bytes per element:

* **lookup (forward compute)**: the shard reads its ids (``n_ids * 8`` bytes), the rows they
  name (``n_ids * c * s``) and writes one pooled vector per sample it serves
  (``n_out * c * s``), all over the kernel's memory bandwidth (after calibration: measured
  per dim on a table that fits the caches and on one that does not, interpolated by the
  shard's size). Table-wise and column-wise shards see every sample's ids
  (``n_ids = G * P``); row-wise shards see their share of the ids
  (``G * P * rows / num_embeddings``) but write partial sums for all ``G`` samples;
  data-parallel replicas serve their own ``B`` samples.
* **backward + fused update**: ``bwd_compute_factor`` x forward (TorchRec's 2), or the
  measured backward bandwidth after calibration. Data-parallel adds a dense optimizer pass
  over the whole table (at the measured ``dense_update_bw`` after calibration).
* **communication**: bytes over the link bandwidth, mixing intra- and inter-host links by
  the share of peers on the same host. Table-/column-wise: all-to-all of ids and pooled
  vectors (and gradients back). Row-wise: ids all-to-all, pooled partial sums
  reduce-scattered, gradients all-gathered. Table-row-wise: reduce-scatter inside the host,
  then all-to-all across hosts. Data-parallel: a ring all-reduce of the table's gradient.
* **pooled-output handling** (calibrated topologies): what the sharded module itself does
  with the pooled vectors a shard produces besides the kernel and the collectives (copies
  into and out of the collectives' buffers, column gathers and their gradients): the
  shard's pooled bytes (``n_out * c * s``) over the type's measured ``pooled_output_bw``,
  half in forward and half in backward. Uncalibrated topologies leave it out, as TorchRec.
* **ranks sharing a host** (:func:`slowest_rank_time`): kernel work of ranks that share
  cores does not run in parallel. A host whose ranks do ``P`` ranks' worth of work at once
  (``topology.parallel_ranks``) needs at least the sum of its ranks' compute over ``P``
  plus their mean communication; the step is the larger of that and the slowest rank.
  GPUs (``host_parallelism`` None) never reach that bound.
* **managed-collision remappers** (zch tables: ``remap_bytes_per_row``,
  ``remap_ns_per_id``): the remapper's parts live with the rows, so a row-wise or
  table-wise shard holds ``rows * remap_bytes_per_row`` of state and remaps its share of
  the step's ids (``G * P * rows / num_embeddings``) at ``remap_ns_per_id`` each, in
  forward compute. Where every holder has every row (column-wise, data-parallel) the parts
  go round the holders; one holder may get them all, so each is priced the whole table's
  state and ids (an upper bound). The state is the model's device memory (HBM on GPUs, DDR
  on CPUs) whatever the kernel caches. The ranks' exchange of keys and slots is not priced.
* **storage**: weights + optimizer state (none for SGD, one float per row for row-wise
  Adagrad, 1x for Adagrad, 2x for Adam) + input/output buffers for two batches in flight
  (the train pipeline overlaps the next batch's input distribution). Cached kernels keep
  ``cache_load_factor`` of weights and state on the device and all of it in host memory;
  on CPU, ``fused_cached`` keeps that share in host memory and all of it on disk
  (``option.disk``), its lookups paying the misses (``1 - cache_load_factor``) at
  :data:`DISK_BW`.

Example:
    >>> price(option, topology, batch_size=512)   # fills option.fwd_compute, .hbm, ...
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ctrctl.distributed.planner.topology import Topology
from ctrctl.distributed.planner.types import (
    INDEX_BYTES,
    OPTIMIZER_STATE,
    Estimator,
    ShardingOption,
)
from ctrctl.names import ComputeKernel, ShardingType

#: Batches whose input/output buffers are alive at once in the train pipeline.
PIPELINE_DEPTH = 2
# FBGEMM's GPU kernels process 128-wide rows per warp; narrower rows leave lanes idle.
# TorchRec measured these penalties for half and quarter blocks.
_HALF_BLOCK_PENALTY = 1.15
_QUARTER_BLOCK_PENALTY = 1.75


#: Random-row bandwidth of the disk under a ``fused_cached`` table (bytes/s): a rough figure
#: for an SSD serving rows through the page cache.
DISK_BW = 1.0 * 2**30


def _interp_by_dim(table: dict[str, float], cols: np.ndarray) -> np.ndarray:
    """A measured figure per dim, interpolated in log2(dim) (held flat outside the range)."""
    dims = np.array(sorted(int(k) for k in table), dtype=np.float64)
    values = np.array([table[str(int(d))] for d in dims], dtype=np.float64)
    return np.interp(np.log2(np.maximum(cols, 1)), np.log2(dims), values)


def kernel_bandwidth(topology: Topology, kernel: str, cols: np.ndarray,
                     cache_load_factor: np.ndarray | float | None, backward: bool = False,
                     shard_bytes: np.ndarray | None = None) -> np.ndarray:
    """Effective bytes/s of the lookup (or backward) kernel on shards ``cols`` wide.

    With figures measured on small (cached) and on large tables, a shard of
    ``shard_bytes`` takes the seconds per byte interpolated between them in log(bytes).
    """
    cols = np.asarray(cols, dtype=np.float64)
    cached = topology.kernel_bwd_bw_cached if backward else topology.kernel_fwd_bw_cached
    if shard_bytes is None or not cached:
        if cols.size > 1 and cols[0] == cols[-1] and (cols == cols[0]).all():
            # Most options have equal blocks: one value broadcasts over all of them.
            return kernel_bandwidth(topology, kernel, cols[:1], cache_load_factor, backward)
        shard_bytes = None
    measured = topology.kernel_bwd_bw if backward else topology.kernel_fwd_bw
    if measured:
        base = _interp_by_dim(measured, cols)
        if shard_bytes is not None and cached:
            small = _interp_by_dim(cached, cols)
            low, high = (math.log(b) for b in topology.kernel_table_bytes)
            share = np.clip((np.log(np.maximum(shard_bytes, 1.0)) - low) / (high - low), 0, 1)
            base = 1.0 / ((1 - share) / small + share / base)
    else:
        peak = topology.ddr_bw if topology.device == "cpu" else topology.hbm_bw
        base = np.full(cols.shape, peak)
        if topology.device == "cuda":
            base = base / np.where(cols >= 128, 1.0,
                                   np.where(cols >= 64, _HALF_BLOCK_PENALTY,
                                            _QUARTER_BLOCK_PENALTY))
        if backward:
            base = base / topology.bwd_compute_factor
    if topology.device == "cpu":
        if kernel == ComputeKernel.FUSED_CACHED.value:
            clf = topology.cache_load_factor if cache_load_factor is None else cache_load_factor
            return 1.0 / (1.0 / base + (1.0 - clf) / DISK_BW)
        return base * (0.5 if kernel == ComputeKernel.DENSE.value else 1.0)
    ratio = base / topology.hbm_bw  # the kernel's efficiency, carried to slower memories
    if kernel == ComputeKernel.FUSED_UVM_CACHING.value:
        clf = topology.cache_load_factor if cache_load_factor is None else cache_load_factor
        return ratio * (clf * topology.hbm_bw + (1 - clf) * topology.hbm_to_ddr_bw)
    if kernel == ComputeKernel.FUSED_UVM.value:
        return ratio * topology.hbm_to_ddr_bw
    if kernel == ComputeKernel.DENSE.value:
        return base * 0.5
    return base


@dataclass
class _Terms:
    """What a shard moves, independent of the kernel: bytes and communication seconds."""

    lookup_bytes: np.ndarray
    update_bytes: np.ndarray | None
    fwd_comms: np.ndarray
    bwd_comms: np.ndarray
    weights_state: np.ndarray
    io: np.ndarray
    cols: np.ndarray
    #: Row-wise and data-parallel shards are all alike but the last: terms are computed on
    #: the distinct shards and ``expand`` maps them back to every shard.
    expand: np.ndarray | None = None
    #: Seconds the sharded module spends on the shard's pooled vectors (None: not modeled).
    output_s: np.ndarray | None = None
    #: Bytes of each shard's weights (the rows its kernel reads).
    shard_bytes: np.ndarray | None = None
    #: Seconds of each shard's managed-collision remap per step, and bytes of its remapper
    #: state (None: no remapper). The state sits in the device's memory whatever the kernel.
    remap_s: np.ndarray | None = None
    remap_bytes: np.ndarray | None = None


def _terms(option: ShardingOption, topology: Topology, batch_size: int) -> _Terms:
    table = option.table
    rows = option.rows.astype(np.float64)
    cols = option.cols.astype(np.float64)
    expand = None
    k = rows.shape[0]
    if k > 4 and rows[0] == rows[-2] and (rows[:-1] == rows[0]).all() \
            and (cols == cols[0]).all():
        expand = np.zeros(k, dtype=np.intp)
        expand[-1] = 1
        rows, cols = rows[[0, -1]], cols[[0, -1]]
    per_row, per_element = OPTIMIZER_STATE[table.optimizer]
    columns = TableColumns(float(table.element_bytes), float(table.pooling_factor),
                           float(table.num_embeddings), per_row, per_element,
                           float(table.remap_bytes_per_row), float(table.remap_ns_per_id))
    terms = shard_terms(option.sharding_type, rows, cols, columns, topology, batch_size)
    terms.expand = expand
    return terms


@dataclass
class TableColumns:
    """What the cost model reads from a table, each a number or an array aligned with the
    shards priced together (one element per shard, possibly of different tables)."""

    element_bytes: np.ndarray | float
    pooling_factor: np.ndarray | float
    num_embeddings: np.ndarray | float
    state_per_row: np.ndarray | float
    state_per_element: np.ndarray | float
    remap_bytes_per_row: np.ndarray | float = 0.0
    remap_ns_per_id: np.ndarray | float = 0.0


def shard_terms(sharding_type: str, rows: np.ndarray, cols: np.ndarray, table: TableColumns,
                topology: Topology, batch_size: int) -> _Terms:
    """The kernel-independent terms of shards of one sharding type, ``rows`` x ``cols``
    each (float arrays); ``table`` broadcasts against them."""
    kind = ShardingType(sharding_type)
    world, local = topology.world_size, topology.local_world_size
    s = table.element_bytes
    pooling = table.pooling_factor
    global_batch = float(batch_size) * world
    # Share of a rank's peers on its own host: how much of an all-to-all stays local.
    local_share = (local - 1) / (world - 1) if world > 1 else 1.0
    remote = (world - 1) / world  # share of a rank's traffic that leaves it at all
    zeros = np.zeros_like(rows)

    if kind is ShardingType.DATA_PARALLEL:
        n_ids = np.full_like(rows, batch_size) * pooling
        n_out = np.full_like(rows, float(batch_size))
    elif kind in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
        n_ids = global_batch * pooling * rows / table.num_embeddings
        n_out = np.full_like(rows, global_batch)
    else:
        n_ids = np.full_like(rows, global_batch) * pooling
        n_out = np.full_like(rows, global_batch)
    ids_bytes = n_ids * INDEX_BYTES
    out_bytes = n_out * cols * s
    lookup_bytes = ids_bytes + n_ids * cols * s + out_bytes
    per_row, per_element = table.state_per_row, table.state_per_element
    update_bytes = None

    if kind is ShardingType.DATA_PARALLEL:
        # Dense update: read weight and gradient, write weight, read+write each state.
        update_bytes = rows * cols * s * 3 + 8 * rows * (per_row + per_element * cols)
    if world == 1:
        fwd_comms, bwd_comms = zeros, zeros
    elif kind is ShardingType.DATA_PARALLEL:
        fwd_comms = zeros
        # Ring all-reduce: each rank sends and receives 2 (W-1)/W of the gradient; across
        # hosts the ring's slowest hop is the inter-host link.
        ring_bw = topology.comm_bw("all_reduce", 1.0 if topology.num_hosts == 1 else 0.0)
        bwd_comms = 2 * remote * rows * cols * s / ring_bw
    elif kind is ShardingType.TABLE_ROW_WISE:
        a2a = topology.comm_bw("all_to_all", local_share)
        intra = topology.comm_bw("reduce_scatter", 1.0)
        inter = topology.comm_bw("all_to_all", 0.0)
        host_remote = (world - local) / world
        per_dir = out_bytes * (local - 1) / local / intra + out_bytes / local * host_remote / inter
        fwd_comms = ids_bytes * remote / a2a + per_dir
        bwd_comms = per_dir
    elif kind is ShardingType.ROW_WISE:
        fwd_comms = (ids_bytes * remote / topology.comm_bw("all_to_all", local_share)
                     + out_bytes * remote / topology.comm_bw("reduce_scatter", local_share))
        bwd_comms = out_bytes * remote / topology.comm_bw("all_gather", local_share)
    else:
        a2a = topology.comm_bw("all_to_all", local_share)
        fwd_comms = (ids_bytes + out_bytes) * remote / a2a
        bwd_comms = out_bytes * remote / a2a

    handled = topology.pooled_output_bw.get(kind.value)
    if handled and kind is not ShardingType.DATA_PARALLEL:
        # The rank's own work (it counts as compute): half in forward, half in the
        # gradients' way back.
        output_s = out_bytes / handled
    else:
        output_s = None

    weights = rows * cols * s
    state = 4.0 * (rows * per_row + rows * cols * per_element)
    io = PIPELINE_DEPTH * (ids_bytes + 2 * out_bytes)  # ids, pooled output and its gradient
    if kind is ShardingType.DATA_PARALLEL:
        io = io + weights  # the dense gradient of the replica
    remap_s = remap_bytes = None
    if np.any(np.asarray(table.remap_bytes_per_row) > 0) or \
            np.any(np.asarray(table.remap_ns_per_id) > 0):
        # The remapper's parts sit with the rows (row-split types); where every holder has
        # every row, one holder may hold them all: priced whole (an upper bound).
        held = rows if kind in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE,
                                ShardingType.TABLE_WISE) else table.num_embeddings + zeros
        remap_bytes = held * table.remap_bytes_per_row
        remap_s = global_batch * pooling * held / table.num_embeddings \
            * table.remap_ns_per_id * 1e-9
    return _Terms(lookup_bytes, update_bytes, fwd_comms, bwd_comms, weights + state, io,
                  cols, None, output_s, weights, remap_s, remap_bytes)


def kernel_parts(kernel: str, clf: np.ndarray | float | None, terms: _Terms,
                 topology: Topology) -> tuple[np.ndarray, ...]:
    """Seconds and bytes of shards under ``kernel``: forward and backward compute, forward
    and backward comms, hbm, ddr and disk bytes (each broadcastable to the shards)."""
    cols = terms.cols
    fwd_compute = terms.lookup_bytes / kernel_bandwidth(topology, kernel, cols, clf,
                                                        shard_bytes=terms.shard_bytes)
    bwd_bw = kernel_bandwidth(topology, kernel, cols, clf, backward=True,
                              shard_bytes=terms.shard_bytes)
    bwd_compute = terms.lookup_bytes / bwd_bw
    if terms.update_bytes is not None:
        update_bw = topology.dense_update_bw or bwd_bw
        bwd_compute = bwd_compute + terms.update_bytes / update_bw
    if terms.output_s is not None:
        fwd_compute = fwd_compute + 0.5 * terms.output_s
        bwd_compute = bwd_compute + 0.5 * terms.output_s
    if terms.remap_s is not None:
        fwd_compute = fwd_compute + terms.remap_s
    zeros = np.zeros_like(terms.io)
    disk = zeros
    clf_value = topology.cache_load_factor if clf is None else clf
    if topology.device == "cpu" and kernel == ComputeKernel.FUSED_CACHED.value:
        hbm, ddr = zeros, clf_value * terms.weights_state + terms.io
        disk = np.broadcast_to(terms.weights_state, terms.io.shape).copy()
    elif topology.device == "cpu":
        hbm, ddr = zeros, terms.weights_state + terms.io
    elif kernel == ComputeKernel.FUSED_UVM_CACHING.value:
        hbm, ddr = clf_value * terms.weights_state + terms.io, terms.weights_state
    elif kernel == ComputeKernel.FUSED_UVM.value:
        hbm, ddr = terms.io, terms.weights_state
    else:
        hbm, ddr = terms.weights_state + terms.io, zeros
    if terms.remap_bytes is not None:  # the remapper's buffers: the model's device memory
        if topology.device == "cpu":
            ddr = ddr + terms.remap_bytes
        else:
            hbm = hbm + terms.remap_bytes
    return (fwd_compute, bwd_compute, terms.fwd_comms, terms.bwd_comms, np.ceil(hbm),
            np.ceil(ddr), disk)


def _apply_kernel(option: ShardingOption, terms: _Terms, topology: Topology) -> None:
    kernel = option.compute_kernel
    *costs, disk = kernel_parts(kernel, option.cache_load_factor, terms, topology)
    parts = [np.broadcast_to(p, terms.io.shape).copy() for p in costs]
    parts.append(parts[0] + parts[1] + parts[2] + parts[3])
    if terms.expand is not None:
        k = terms.expand.shape[0]
        # totals from the two distinct shards: (k - 1) alike plus the last
        total_cost = float(parts[6][0] * (k - 1) + parts[6][1])
        storage = float((parts[4][0] + parts[5][0]) * (k - 1) + parts[4][1] + parts[5][1])
        full = []
        for p in parts:
            out = np.full(k, p[0])
            out[-1] = p[1]
            full.append(out)
        parts = full
    else:
        total_cost = float(parts[6].sum())
        storage = float(parts[4].sum() + parts[5].sum())
    (option.fwd_compute, option.bwd_compute, option.fwd_comms, option.bwd_comms,
     option.hbm, option.ddr) = parts[:6]
    option.set_totals(parts[6], total_cost, storage)
    if kernel == ComputeKernel.FUSED_CACHED.value:
        disk = np.ceil(disk)
        if terms.expand is not None:  # two distinct shards: (k - 1) alike plus the last
            expanded = np.full(terms.expand.shape[0], disk[0])
            expanded[-1] = disk[1]
            disk = expanded
        option.disk = disk


def price(option: ShardingOption, topology: Topology, batch_size: int) -> ShardingOption:
    """Fill ``option``'s per-shard cost (seconds per step) and storage (bytes); returns it.

    Args:
        option: an option with its geometry (rows, cols) set.
        topology: the ranks it runs on.
        batch_size: samples per rank per step.
    """
    option.pooled_bytes = _pooled_bytes(option, batch_size)
    _apply_kernel(option, _terms(option, topology, batch_size), topology)
    return option


def _pooled_bytes(option: ShardingOption, batch_size: int) -> float:
    return float(batch_size * option.table.embedding_dim * option.table.element_bytes)


def price_kernels(options: list[ShardingOption], topology: Topology, batch_size: int
                  ) -> list[ShardingOption]:
    """Price options that share one geometry and differ only in kernel (one pass over the
    geometry); the first (fastest) kernel now, the others when first used."""
    for option in options:
        option.pooled_bytes = _pooled_bytes(option, batch_size)
    if options:
        terms = _terms(options[0], topology, batch_size)
        _apply_kernel(options[0], terms, topology)
        for option in options[1:]:
            # Slower kernels matter only when the faster one does not fit: price on demand.
            option.pending = lambda o, terms=terms: _apply_kernel(o, terms, topology)
    return options


class EmbeddingPerfEstimator(Estimator):
    """The cost model of this module (TorchRec's constants, or a calibrated topology's).

    Args:
        topology: the ranks, their bandwidths and measured figures.
        batch_size: samples per rank per step.
    """

    def __init__(self, topology: Topology, batch_size: int):
        self.topology = topology
        self.batch_size = batch_size

    def estimate(self, options: list[ShardingOption]) -> list[ShardingOption]:
        return price_kernels(options, self.topology, self.batch_size)


def step_overhead(tables_by_type: Mapping[str, int] | Iterable[str],
                  topology: Topology, pooled_bytes: float = 0.0) -> float:
    """Fixed per-step time of the sharding types a plan uses (the same on every rank).

    Tables of one sharding type share their collectives, so each type in use adds its own
    calls: input ids and outputs forward, gradients backward. A calibrated topology carries
    each type's measured fixed cost and its cost per table (the per-table work of the input
    and output distribution) instead, and what a plan of several types pays to split the
    input between their groups and put their outputs back together (``pooled_bytes`` of
    output per rank over ``group_assembly_bw``).

    Args:
        tables_by_type: sharding type -> number of tables, or the types (one per table).
        pooled_bytes: bytes of every table's pooled vectors per rank (batch x dims).
    """
    if topology.world_size == 1:
        return 0.0
    counts = tables_by_type if isinstance(tables_by_type, Mapping) else Counter(tables_by_type)
    calls = {ShardingType.DATA_PARALLEL.value: 1, ShardingType.TABLE_ROW_WISE.value: 4}
    measured = topology.sharding_overhead_s
    per_table = topology.sharding_overhead_per_table_s
    total = 0.0
    for kind, n in counts.items():
        if n <= 0:
            continue
        total += measured.get(kind, topology.collective_latency_s * calls.get(kind, 3))
        total += per_table.get(kind, 0.0) * n
    if topology.group_assembly_bw and sum(1 for n in counts.values() if n > 0) > 1:
        total += pooled_bytes / topology.group_assembly_bw
    return total


def slowest_rank_time(rank_cost: np.ndarray, topology: Topology) -> float:
    """Seconds per step of the ranks' own work (without the fixed overhead).

    The slowest rank, or, where a host's ranks share cores (``topology.parallel_ranks`` below
    its ranks), the host's kernel work over the ranks' worth it does at once plus its ranks'
    mean communication, whichever is longer.

    Args:
        rank_cost: ``(W, 4)`` seconds per rank: forward and backward compute, forward and
            backward communication.
    """
    if rank_cost.size == 0:
        return 0.0
    slowest = float(rank_cost.sum(axis=1).max())
    local = topology.local_world_size
    parallel = topology.parallel_ranks
    if parallel >= local:
        return slowest
    hosts = rank_cost.reshape(topology.world_size // local, local, rank_cost.shape[1])
    compute = hosts[:, :, :2].sum(axis=(1, 2)) / parallel
    comms = hosts[:, :, 2:].sum(axis=(1, 2)) / local
    return max(slowest, float((compute + comms).max()))

