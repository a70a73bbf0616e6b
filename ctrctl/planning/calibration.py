"""Measure this machine for the cost model: kernel speed per dim, memory and link bandwidth.

TorchRec's planner uses fixed constants; ``ctrctl plan --calibrate`` replaces them with
short microbenchmarks here (under a minute) and writes ``topology.json``:

* **embedding kernels**: the kernel a CPU run trains with (``BatchedEmbeddingBag`` with
  ``backend="auto"``, as the sharded module builds it: the native C kernel where it was
  built, else FBGEMM's training TBE or plain torch; exact row-wise Adagrad fused into
  backward), forward and backward+update, per embedding dim, on a table that fits the
  caches (1 MiB) and on one that does not (64 MiB); the figure stored is bytes the cost
  model counts (ids + rows read + pooled output) over the measured seconds, so the model
  reproduces the measurement.
* **memory bandwidth**: a large tensor copy.
* **collectives**: ``all_to_all_single``, the reduce-scatter and all-gather as
  ``ctrctl.distributed.comm`` runs them on gloo (through one all-to-all each), and
  ``all_reduce`` between two local processes over gloo at
  64 KiB to 8 MiB; a line through the times gives each one's fixed latency and bandwidth
  (in the cost model's own convention for each collective).
* **sharding types**, from the sharded module itself on two ranks: the fixed cost per step
  of each type and its cost per table (collectives' latency, the input/output
  distribution's own work) on 2 and on 6 tiny tables; its handling of pooled vectors (a
  data-parallel replica's dense update) on mid-sized tables; how much of the two ranks'
  work overlaps (``host_parallelism``), from those tables spread over both ranks and all on
  one (see :func:`measure_sharding_types`).

Each process uses one thread, as each rank of a CPU run does.

Example:
    >>> topo = calibrate("topology.json")      # then: ctrctl plan --topology topology.json
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctrctl.distributed.planner.topology import GIB, Topology
from ctrctl.distributed.planner.types import INDEX_BYTES
from ctrctl.errors import OutputExistsError

if TYPE_CHECKING:
    from ctrctl.modules.optimizers import OptimizerKind

logger = logging.getLogger(__name__)

#: The optimizer the kernel benchmark fuses into backward (the sharded module's default).
CALIBRATION_OPTIMIZER: OptimizerKind = "exact_rowwise_adagrad"
#: Embedding dims the kernel benchmark covers (others are interpolated in log2(dim)).
CALIBRATION_DIMS = (16, 32, 64, 128, 256)


def _fastest_time(fn: Callable[[], Any], repeats: int, warmup: int = 2) -> float:
    """The fastest of ``repeats`` calls: other work on the machine only ever adds time."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _timed_lookup(lookup: tuple[Callable[[], Any], int], dim: int,
                  repeats: int) -> tuple[float, float]:
    """The fastest forward and backward(+update) of ``repeats`` (after two warm-ups)."""
    import torch

    forward, batch = lookup
    with torch.no_grad():
        fwd = _fastest_time(forward, repeats)
    grad = torch.ones(batch, dim)
    backward_times = []
    for i in range(repeats + 2):  # two warm-up steps
        out = forward()
        start = time.perf_counter()
        out.backward(grad)  # the optimizer step is fused into it
        if i >= 2:
            backward_times.append(time.perf_counter() - start)
    return fwd, min(backward_times)


def _kernel_lookup(dim: int, rows: int, batch: int, pooling: int
                   ) -> tuple[Callable[[], Any], int]:
    """One table's lookup (forward; its backward applies the update) and the batch, on
    fixed random ids, in the kernel a CPU run trains with (``backend="auto"``: the native C
    kernel where it was built, else FBGEMM's or torch's)."""
    import torch

    from ctrctl.modules.batched_embedding import BatchedEmbeddingBag
    from ctrctl.modules.optimizers import EmbeddingOptimizerConfig

    torch.manual_seed(0)
    ids = torch.randint(0, rows, (batch * pooling,), dtype=torch.int64)
    offsets = torch.arange(0, batch * pooling + 1, pooling, dtype=torch.int64)
    module = BatchedEmbeddingBag([(rows, dim)], device="cpu", backend="auto",
                                 optimizer=EmbeddingOptimizerConfig(kind=CALIBRATION_OPTIMIZER))

    def forward() -> Any:
        return module(ids, offsets)

    return forward, batch


@dataclass
class KernelFigures:
    """Effective bandwidths (bytes/s, as the cost model counts bytes) of the embedding kernel
    by dim: forward and backward(+update), on a table that fits the caches and on one that
    does not (of ``table_bytes``)."""

    fwd_bw: dict[str, float]
    bwd_bw: dict[str, float]
    fwd_bw_cached: dict[str, float]
    bwd_bw_cached: dict[str, float]
    table_bytes: tuple[float, float]


#: Table sizes of the kernel benchmark: one that fits a core's caches, one far beyond them.
KERNEL_TABLE_BYTES = (2.0**20, 2.0**26)


def measure_kernels(dims: tuple[int, ...] = CALIBRATION_DIMS,
                    table_bytes: tuple[float, float] = KERNEL_TABLE_BYTES,
                    batch: int = 4096, pooling: int = 4, repeats: int = 5, rounds: int = 2
                    ) -> KernelFigures:
    """The embedding kernel's forward and backward bandwidth at each dim, on a small and on
    a large table: the fastest of ``rounds`` passes over them (a burst of other work on the
    machine then spoils one pass of one case, not the figure)."""
    cases = [(dim, size) for size in table_bytes for dim in dims]
    lookups = {(dim, size): _kernel_lookup(dim, max(int(size) // (dim * 4), 1), batch, pooling)
               for dim, size in cases}
    best = {case: (math.inf, math.inf) for case in cases}
    for _ in range(rounds):
        for dim, size in cases:
            fwd, bwd = _timed_lookup(lookups[(dim, size)], dim, repeats)
            old = best[(dim, size)]
            best[(dim, size)] = (min(old[0], fwd), min(old[1], bwd))
    figures: list[dict[str, float]] = [{}, {}, {}, {}]
    n_ids = batch * pooling
    for dim, size in cases:
        fwd, bwd = best[(dim, size)]
        counted = n_ids * INDEX_BYTES + n_ids * dim * 4 + batch * dim * 4
        at = 0 if size == table_bytes[1] else 2
        figures[at][str(dim)] = counted / fwd
        figures[at + 1][str(dim)] = counted / bwd
        logger.info("kernel dim %d, %.0f MiB table: forward %.3f ms, backward+update %.3f ms",
                    dim, size / 2**20, fwd * 1e3, bwd * 1e3)
    return KernelFigures(figures[0], figures[1], figures[2], figures[3], table_bytes)


def measure_memory_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes/s of a large copy (each byte read once and written once)."""
    import torch

    src = torch.ones(megabytes * 2**20 // 4)
    dst = torch.empty_like(src)
    seconds = _fastest_time(lambda: dst.copy_(src), repeats)
    return 2 * src.numel() * 4 / seconds


#: Message sizes (bytes per rank) of the collectives' benchmark: the range a CPU run moves
#: (ids and pooled vectors of a few thousand samples, gradients of data-parallel tables).
COLLECTIVE_SIZES = (64 * 2**10, 512 * 2**10, 2 * 2**20, 8 * 2**20)


# What ctrctl.distributed.comm runs on gloo (its row-wise output distribution): the
# reduce-scatter as one all-to-all plus a local sum, the all-gather as one all-to-all of the
# rank's block repeated (gloo's own collectives are several times slower).
def _reduce_scatter_as_all_to_all(x: Any, recv: Any, out: Any, world_size: int) -> None:
    import torch
    import torch.distributed as dist

    dist.all_to_all_single(recv, x)
    torch.sum(recv.view(world_size, -1), dim=0, out=out)


def _all_gather_as_all_to_all(x: Any, send: Any, out: Any, world_size: int) -> None:
    import torch.distributed as dist

    send.view(world_size, -1).copy_(x.expand(world_size, -1))
    dist.all_to_all_single(out, send)


def _collective_body(rank: int, world_size: int, sizes: tuple[int, ...], repeats: int
                     ) -> dict[str, float]:
    """Run in each of two processes: seconds of each collective at each size."""
    import torch
    import torch.distributed as dist

    def timed(fn: Callable[[], Any]) -> float:
        dist.barrier()
        return _fastest_time(fn, repeats)

    out: dict[str, float] = {}
    for nbytes in sizes:
        numel = nbytes // 4
        x = torch.ones(numel)
        a2a_out = torch.empty_like(x)
        rs_out = torch.empty(numel // world_size)
        ag_send = torch.empty(numel * world_size)
        ag_out = torch.empty(numel * world_size)

        calls: dict[str, Callable[[], Any]] = {
            "all_to_all": functools.partial(dist.all_to_all_single, a2a_out, x),
            "reduce_scatter": functools.partial(_reduce_scatter_as_all_to_all, x, a2a_out,
                                                rs_out, world_size),
            "all_gather": functools.partial(_all_gather_as_all_to_all, x, ag_send, ag_out,
                                            world_size),
            "all_reduce": functools.partial(dist.all_reduce, x),
        }
        for name, call in calls.items():
            out[f"{name}_{nbytes}"] = timed(call)
    return out


def fit_latency_bandwidth(charged: list[float], seconds: list[float]) -> tuple[float, float]:
    """``seconds = latency + charged / bandwidth`` fitted to measurements, each point
    weighted by its inverse time (relative errors count, so small messages weigh as much as
    large ones); returns (latency >= 0, bandwidth)."""
    import numpy as np

    x, y = np.asarray(charged, dtype=np.float64), np.asarray(seconds, dtype=np.float64)
    w = 1.0 / y
    design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (latency, per_byte), *_ = np.linalg.lstsq(design, y * w, rcond=None)
    if latency < 0:  # the line through the origin
        latency, per_byte = 0.0, float((w * w * x * y).sum() / (w * w * x * x).sum())
    if per_byte <= 0:  # no growth with size: the largest message's average rate
        per_byte = float(y[-1] / x[-1])
    return float(latency), 1.0 / float(per_byte)


def measure_collectives(sizes: tuple[int, ...] = COLLECTIVE_SIZES, repeats: int = 5
                        ) -> tuple[dict[str, float], float]:
    """Bandwidth of each collective between two local processes (bytes/s, in the cost
    model's convention) and the fixed latency of one call (seconds, the median over the
    collectives), fitted over ``sizes`` bytes per rank."""
    from ctrctl.distributed.processes import run_multiprocess

    results = run_multiprocess(_collective_body, world_size=2, args=(sizes, repeats),
                               timeout_s=120)
    # The slower rank sets the pace of a collective.
    times = {k: max(r[k] for r in results) for k in results[0]}
    world = 2
    remote = (world - 1) / world
    # Bytes the cost model charges for one call on ``n`` bytes per rank.
    factor = {"all_to_all": remote, "reduce_scatter": remote, "all_gather": world * remote,
              "all_reduce": 2 * remote}
    bandwidth, latencies = {}, []
    for name, f in factor.items():
        latency, bw = fit_latency_bandwidth([n * f for n in sizes],
                                            [times[f"{name}_{n}"] for n in sizes])
        bandwidth[name] = bw
        latencies.append(latency)
        logger.info("%s: latency %.3f ms, %.2f GB/s", name, latency * 1e3, bw / 1e9)
    return bandwidth, statistics.median(latencies)


@dataclass
class ShardingFigures:
    """What the sharded module costs per sharding type, beyond kernels and collectives.

    Attributes:
        overhead_s: fixed seconds per step of each type.
        overhead_per_table_s: further seconds per step per table of each type.
        pooled_output_bw: bytes/s of each type's handling of pooled vectors (routed types).
        dense_update_bw: bytes/s of a data-parallel replica's dense backward and update.
        host_parallelism: ranks' worth of work the two ranks do at once (None: both).
        group_assembly_bw: bytes/s of putting several sharding groups' outputs together
            (the routed types' handling rate: the same copies of the same vectors).
    """

    overhead_s: dict[str, float]
    overhead_per_table_s: dict[str, float]
    pooled_output_bw: dict[str, float]
    dense_update_bw: float | None
    host_parallelism: float | None
    group_assembly_bw: float | None


def _tiny_tables(n: int) -> list[Any]:
    from ctrctl.distributed.planner.types import TableConstraints, TableSpec

    return [TableSpec(f"tiny{i}", 64, 16, constraints=TableConstraints(min_col_block=8))
            for i in range(n)]


def _bulk_tables(replicated: bool = False) -> list[Any]:
    """Tables whose pooled vectors are large enough to time their handling: a mix of dims
    and pooling factors. Replicated (data-parallel) ones are four times taller: a replica's
    cost is its size, and the allocator serves tens of MB differently from a few."""
    from ctrctl.distributed.planner.types import TableConstraints, TableSpec

    blocks = TableConstraints(min_col_block=16)
    scale = 4 if replicated else 1
    return [TableSpec("bulk0", 50_000 * scale, 64, pooling_factor=4.0, constraints=blocks),
            TableSpec("bulk1", 20_000 * scale, 128, pooling_factor=1.0, constraints=blocks),
            TableSpec("bulk2", 30_000 * scale, 32, pooling_factor=2.0, constraints=blocks),
            TableSpec("bulk3", 10_000 * scale, 64, pooling_factor=1.0, constraints=blocks)]


def _solve_increasing(f: Callable[[float], float], target: float) -> float:
    """The ``x >= 0`` where the increasing ``f`` reaches ``target`` (0 when f(0) already
    does), by doubling then bisection."""
    if f(0.0) >= target:
        return 0.0
    high = 1e-12
    while f(high) < target and high < 1.0:
        high *= 2
    low = 0.0
    for _ in range(50):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if f(mid) < target else (low, mid)
    return high


#: Sharding types that share one code path (ids routed whole, a pooled all-to-all, then a
#: column gather) and so their figures: the median over their runs.
ROUTED_TYPES = ("table_wise", "column_wise", "table_column_wise")


def measure_sharding_types(topology: Topology, steps: int = 10, rounds: int = 2,
                           bulk_batch: int = 1024) -> ShardingFigures:
    """Each sharding type's own costs, and how much the two ranks' work overlaps, from the
    sharded module on two ranks.

    * fixed and per-table seconds: runs on 2 and on 6 tiny tables (tiny batch), whose time
      is all latency, bucketing, permutes and launches;
    * the handling of pooled vectors (data-parallel: the dense update): a run on a few
      mid-sized tables at ``bulk_batch`` samples per rank; the figure is the one with which
      ``topology``'s cost model reproduces the measured step (row-wise types reduce-scatter
      their partial sums with few copies; the routed types copy theirs several times);
    * the host's parallelism: the same tables table-wise, once spread over both ranks and
      once all on rank 0. Where the ranks share cores the spread plan is hardly faster; the
      figure is the one with which the model reproduces both runs.

    Every per-byte figure is at most the measured memory bandwidth (no copy is faster).

    Types that share a code path (:data:`ROUTED_TYPES`) share the median of their figures:
    one run of each is three measurements of one thing.

    Each run is the fastest of ``rounds`` (runs of all types interleaved).

    Args:
        topology: the measured kernel, memory and collective figures (two ranks, one host).
    """
    from ctrctl.distributed.planner.planner import EmbeddingShardingPlanner, rate_plan
    from ctrctl.distributed.planner.types import TableConstraints
    from ctrctl.distributed.processes import run_multiprocess
    from ctrctl.names import ShardingType
    from ctrctl.planning.measure import measure_many_body, table_payload

    dp = ShardingType.DATA_PARALLEL.value
    tiny_topo = Topology.preset("cpu", 2, 2)
    kinds = [t.value for t in ShardingType]
    sizes = (2, 6)
    items, bulk = [], {}
    for kind in kinds:
        for n in sizes:
            tiny = _tiny_tables(n)
            plan = EmbeddingShardingPlanner(tiny_topo, 16, (kind,)).plan(tiny).plan
            items.append((table_payload(tiny), plan.to_dict(), 16, 2 * steps))
        tables = _bulk_tables(replicated=kind == dp)
        plan = EmbeddingShardingPlanner(topology, bulk_batch, (kind,)).plan(tables).plan
        bulk[kind] = (tables, plan)
        items.append((table_payload(tables), plan.to_dict(), bulk_batch, steps))
    table_wise = ShardingType.TABLE_WISE.value
    pinned = [dataclasses.replace(t, constraints=TableConstraints(ranks=(0,)))
              for t in bulk[table_wise][0]]
    one_rank = EmbeddingShardingPlanner(topology, bulk_batch, (table_wise,)).plan(pinned).plan
    items.append((table_payload(pinned), one_rank.to_dict(), bulk_batch, steps))
    runs = run_multiprocess(measure_many_body, 2, args=(items * rounds,), timeout_s=600)
    # The slower rank of a run; the fastest of the rounds.
    times = [min(max(rank[r * len(items) + i] for rank in runs) for r in range(rounds))
             for i in range(len(items))]
    fixed, per_table = {}, {}
    for k, kind in enumerate(kinds):
        small, large = times[3 * k: 3 * k + 2]
        per_table[kind] = max((large - small) / (sizes[1] - sizes[0]), 0.0)
        fixed[kind] = max(small - per_table[kind] * sizes[0], 0.0)
    for figure in (fixed, per_table):
        shared = statistics.median(figure[k] for k in ROUTED_TYPES)
        figure.update({k: shared for k in ROUTED_TYPES})
    measured = {kind: times[3 * k + 2] for k, kind in enumerate(kinds)}
    known = dataclasses.replace(topology, sharding_overhead_s=fixed,
                                sharding_overhead_per_table_s=per_table)

    def handling(kind: str, topo: Topology) -> float:
        """Seconds per byte with which the model reproduces ``kind``'s run on ``topo``."""
        tables, plan = bulk[kind]

        def estimate(per_byte: float) -> float:
            bw = 1.0 / per_byte if per_byte > 0 else 1e30  # 1e30: free
            if kind == dp:
                priced = dataclasses.replace(topo, dense_update_bw=bw)
            else:
                priced = dataclasses.replace(topo, pooled_output_bw={kind: bw})
            return rate_plan(plan, tables, priced, bulk_batch).step_time

        return _solve_increasing(estimate, measured[kind])

    def routed(topo: Topology) -> Topology:
        per_byte = statistics.median(handling(k, topo) for k in ROUTED_TYPES)
        bw = 1.0 / per_byte if per_byte > 0 else 1e30
        return dataclasses.replace(topo, pooled_output_bw={k: bw for k in ROUTED_TYPES})

    def one_rank_estimate(parallel: float) -> float:
        topo = routed(dataclasses.replace(known, host_parallelism=parallel))
        return rate_plan(one_rank, pinned, topo, bulk_batch).step_time

    # More parallelism makes the spread runs cheaper, so the fitted handling dearer, so the
    # one-rank run's estimate longer: the estimate rises with the figure from 1 on. (Below
    # one rank's worth the host bound would charge the lone busy rank of the one-rank run
    # more than its own work: that estimate falls as the figure rises, and a search from
    # there stopped at its floor, doubling every later estimate.) A host does at least one
    # rank's work at a time.
    low, high = 1.0, 2.0
    one_rank_time = times[-1]
    if one_rank_estimate(high) <= one_rank_time:
        parallel = None  # no sign of ranks slowing each other
    elif one_rank_estimate(low) >= one_rank_time:
        parallel = low
    else:
        for _ in range(20):
            mid = 0.5 * (low + high)
            low, high = (mid, high) if one_rank_estimate(mid) < one_rank_time else (low, mid)
        parallel = 0.5 * (low + high)
    logger.info("host: 2 ranks do %s ranks' worth of work at once (tables spread %.2f ms, on "
                "one rank %.2f ms)", "2" if parallel is None else f"{parallel:.2f}",
                measured[table_wise] * 1e3, one_rank_time * 1e3)
    known = routed(dataclasses.replace(known, host_parallelism=parallel))
    # No handling is faster than a plain copy: the measured memory bandwidth bounds them all.
    fastest = topology.ddr_bw
    pooled_bw = {k: min(v, fastest) for k, v in known.pooled_output_bw.items()}
    for kind in kinds:
        if kind not in ROUTED_TYPES:
            per_byte = handling(kind, dataclasses.replace(known, pooled_output_bw=pooled_bw))
            bw = min(1.0 / per_byte, fastest) if per_byte > 0 else fastest
            if kind == dp:
                known = dataclasses.replace(known, dense_update_bw=bw)
            else:
                pooled_bw[kind] = bw
        logger.info("%s: %.3f ms fixed + %.3f ms per table; run on mid-sized tables %.2f ms",
                    kind, fixed[kind] * 1e3, per_table[kind] * 1e3, measured[kind] * 1e3)
    # Putting several groups' outputs together (a permute of the input per group, then a
    # concatenation and a column reorder, and their gradients) copies the same vectors as
    # the routed types' own handling of them, at about its rate.
    return ShardingFigures(fixed, per_table, pooled_bw, known.dense_update_bw, parallel,
                           pooled_bw[table_wise])



def _memory_total() -> float:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 16.0 * GIB


def calibrate(path: str | Path | None = None, overwrite: bool = False,
              quick: bool = False) -> Topology:
    """Measure this machine and return (and save to ``path``) a CPU topology.

    Args:
        path: where to write ``topology.json`` (None: do not write).
        overwrite: replace an existing file.
        quick: fewer dims and repeats (for tests).

    Raises:
        OutputExistsError: when ``path`` exists and ``overwrite`` is off.
    """
    import torch

    if path is not None and Path(path).exists() and not overwrite:
        raise OutputExistsError("the topology file exists", where=str(path),
                                hint="pass another path or allow overwriting")
    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        dims = (32, 128) if quick else CALIBRATION_DIMS
        kernels = measure_kernels(dims, repeats=3 if quick else 5)
        memory_bw = measure_memory_bandwidth(64 if quick else 256)
    finally:
        torch.set_num_threads(threads)
    collective_bw, latency = measure_collectives(
        COLLECTIVE_SIZES[:-1] if quick else COLLECTIVE_SIZES, repeats=3 if quick else 5)
    topology = Topology.preset(
        "cpu", world_size=2, local_world_size=2, ddr_bytes=_memory_total() / 2,
        ddr_bw=memory_bw,
        intra_host_bw=collective_bw["all_to_all"], kernel_fwd_bw=kernels.fwd_bw,
        kernel_bwd_bw=kernels.bwd_bw, kernel_fwd_bw_cached=kernels.fwd_bw_cached,
        kernel_bwd_bw_cached=kernels.bwd_bw_cached, kernel_table_bytes=kernels.table_bytes,
        collective_bw=collective_bw, collective_latency_s=latency)
    try:
        figures = measure_sharding_types(topology, steps=5 if quick else 10,
                                         rounds=2 if quick else 3)
        topology = dataclasses.replace(
            topology, sharding_overhead_s=figures.overhead_s,
            sharding_overhead_per_table_s=figures.overhead_per_table_s,
            pooled_output_bw=figures.pooled_output_bw,
            dense_update_bw=figures.dense_update_bw, host_parallelism=figures.host_parallelism,
            group_assembly_bw=figures.group_assembly_bw)
    except ImportError as exc:  # the sharded module is not available: latency model only
        logger.warning("sharding types not measured (%s)", exc)
    seconds = time.perf_counter() - start
    topology = dataclasses.replace(topology, calibrated={
        "host": os.uname().nodename, "seconds": seconds,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "threads_per_rank": 1, "torch": torch.__version__,
        "host_memory_bytes": _memory_total(), "kernel": _kernel_name()})
    if path is not None:
        topology.save(path)
    logger.info("calibrated in %.1f s", seconds)
    return topology


def _kernel_name() -> str:
    """The kernel :func:`measure_kernels` times, as ``topology.json`` records it."""
    import torch

    from ctrctl.modules.batched_embedding import resolve_backend
    from ctrctl.modules.optimizers import EmbeddingOptimizerConfig

    backend = resolve_backend("auto", [(1024, 64)],
                              EmbeddingOptimizerConfig(kind=CALIBRATION_OPTIMIZER),
                              torch.device("cpu"))
    return f"{backend} (cpu, {CALIBRATION_OPTIMIZER})"
