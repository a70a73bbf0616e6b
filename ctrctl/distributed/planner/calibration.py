"""Measure this machine for the cost model: kernel speed per dim, memory and link bandwidth.

TorchRec's planner uses fixed constants; ``ctrctl plan --calibrate`` replaces them with
short microbenchmarks here (well under a minute) and writes ``topology.json``:

* **embedding kernels**: FBGEMM's training TBE (``SplitTableBatchedEmbeddingBagsCodegen``,
  CPU, exact row-wise Adagrad fused into backward) forward and backward+update, per
  embedding dim; the figure stored is bytes the cost model counts (ids + rows read + pooled
  output) over the measured seconds, so the model reproduces the measurement. Without
  fbgemm_gpu, ``torch.nn.EmbeddingBag`` with a sparse update stands in.
* **memory bandwidth**: a large tensor copy.
* **sharding types**: the fixed cost per step of each sharding type, and its cost per table
  (collectives' latency, the input/output distribution's own work), from the sharded module
  itself on 2 and on 6 tiny tables.
* **collectives**: ``all_to_all_single``, ``reduce_scatter_tensor``,
  ``all_gather_into_tensor`` and ``all_reduce`` between two local processes over gloo; a
  small message gives the fixed latency, a large one the bandwidth (in the cost model's own
  convention for each collective).

Each process uses one thread, as each rank of a CPU run does.

Example:
    >>> topo = calibrate("topology.json")      # then: ctrctl plan --topology topology.json
"""

from __future__ import annotations

import functools
import logging
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ctrctl.distributed.planner.topology import GIB, Topology
from ctrctl.distributed.planner.types import INDEX_BYTES
from ctrctl.errors import OutputExistsError

logger = logging.getLogger(__name__)

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


def _tbe_step_times(dim: int, rows: int, batch: int, pooling: int, repeats: int
                    ) -> tuple[float, float]:
    """Seconds of one forward and of one backward(+fused update) of one table."""
    import torch

    torch.manual_seed(0)
    ids = torch.randint(0, rows, (batch * pooling,), dtype=torch.int64)
    offsets = torch.arange(0, batch * pooling + 1, pooling, dtype=torch.int64)
    try:
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        module: Any = SplitTableBatchedEmbeddingBagsCodegen(
            [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
            optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.01)

        def forward() -> Any:
            return module(ids, offsets)
    except ImportError:  # a torch without fbgemm_gpu: the plain kernel stands in
        bag = torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=True)
        optimizer = torch.optim.SGD(bag.parameters(), lr=0.01)
        module = bag

        def forward() -> Any:
            return bag(ids, offsets[:-1])

        def step() -> None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    else:
        def step() -> None:
            return None

    with torch.no_grad():
        fwd = _fastest_time(forward, repeats)
    grad = torch.ones(batch, dim)

    backward_times = []
    for i in range(repeats + 2):  # two warm-up steps
        out = forward()
        start = time.perf_counter()
        out.backward(grad)
        step()
        if i >= 2:
            backward_times.append(time.perf_counter() - start)
    return fwd, min(backward_times)


def measure_kernels(dims: tuple[int, ...] = CALIBRATION_DIMS, rows: int = 200_000,
                    batch: int = 4096, pooling: int = 4, repeats: int = 5
                    ) -> tuple[dict[str, float], dict[str, float]]:
    """Effective forward and backward bandwidth (bytes/s, as the cost model counts bytes)
    of the embedding kernel at each dim."""
    fwd_bw, bwd_bw = {}, {}
    for dim in dims:
        fwd, bwd = _tbe_step_times(dim, rows, batch, pooling, repeats)
        n_ids = batch * pooling
        counted = n_ids * INDEX_BYTES + n_ids * dim * 4 + batch * dim * 4
        fwd_bw[str(dim)] = counted / fwd
        bwd_bw[str(dim)] = counted / bwd
        logger.info("kernel dim %d: forward %.3f ms, backward+update %.3f ms", dim,
                    fwd * 1e3, bwd * 1e3)
    return fwd_bw, bwd_bw


def measure_memory_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes/s of a large copy (each byte read once and written once)."""
    import torch

    src = torch.ones(megabytes * 2**20 // 4)
    dst = torch.empty_like(src)
    seconds = _fastest_time(lambda: dst.copy_(src), repeats)
    return 2 * src.numel() * 4 / seconds


def _collective_body(rank: int, world_size: int, small: int, large: int, repeats: int
                     ) -> dict[str, float]:
    """Run in each of two processes: latency and bandwidth of each collective."""
    import torch
    import torch.distributed as dist

    def timed(fn: Callable[[], Any]) -> float:
        dist.barrier()
        return _fastest_time(fn, repeats)

    # torch 2.13 renames the tensor forms; older torch has only the old names.
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    out: dict[str, float] = {}
    for label, numel in (("small", small), ("large", large)):
        x = torch.ones(numel)
        a2a_out = torch.empty_like(x)
        rs_out = torch.empty(numel // world_size)
        ag_out = torch.empty(numel * world_size)
        calls: dict[str, Callable[[], Any]] = {
            "all_to_all": functools.partial(dist.all_to_all_single, a2a_out, x),
            "reduce_scatter": functools.partial(reduce_scatter, rs_out, x),
            "all_gather": functools.partial(all_gather, ag_out, x),
            "all_reduce": functools.partial(dist.all_reduce, x),
        }
        for name, call in calls.items():
            out[f"{name}_{label}"] = timed(call)
    return out


def measure_collectives(large_bytes: int = 16 * 2**20, small_bytes: int = 1024,
                        repeats: int = 7) -> tuple[dict[str, float], float]:
    """Bandwidth of each collective between two local processes (bytes/s, in the cost
    model's convention) and the fixed latency of one call (seconds)."""
    from ctrctl.testing.multiprocess import run_multiprocess

    results = run_multiprocess(_collective_body, world_size=2,
                               args=(small_bytes // 4, large_bytes // 4, repeats),
                               timeout_s=120)
    # The slower rank sets the pace of a collective.
    times = {k: max(r[k] for r in results) for k in results[0]}
    latency = statistics.median(times[f"{c}_small"] for c in
                                ("all_to_all", "reduce_scatter", "all_gather", "all_reduce"))
    world = 2
    remote = (world - 1) / world
    # Bytes the cost model charges for one call on ``large_bytes`` per rank.
    charged = {"all_to_all": large_bytes * remote, "reduce_scatter": large_bytes * remote,
               "all_gather": large_bytes * world * remote,
               "all_reduce": 2 * remote * large_bytes}
    bandwidth = {name: charged[name] / max(times[f"{name}_large"] - latency, 1e-9)
                 for name in charged}
    return bandwidth, latency


def measure_sharding_overheads(steps: int = 10) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per step each sharding type costs on two ranks with tiny tables and batch,
    as a fixed part and a part per table (from runs with 2 and with 6 tables): what a type
    adds whatever the tables' size (collective latency, bucketing, permutes, launches)."""
    from ctrctl.distributed.planner.measure import measure_many_body, table_payload
    from ctrctl.distributed.planner.planner import EmbeddingShardingPlanner
    from ctrctl.distributed.planner.types import TableConstraints, TableSpec
    from ctrctl.distributed.types import ShardingType
    from ctrctl.testing.multiprocess import run_multiprocess

    topo = Topology.preset("cpu", 2, 2)
    kinds = [t.value for t in ShardingType]
    sizes = (2, 6)
    items = []
    for kind in kinds:
        for n in sizes:
            tiny = [TableSpec(f"tiny{i}", 64, 16, constraints=TableConstraints(min_col_block=8))
                    for i in range(n)]
            plan = EmbeddingShardingPlanner(topo, 16, (kind,)).plan(tiny).plan
            items.append((table_payload(tiny), plan.to_dict(), 16, steps))
    times = run_multiprocess(measure_many_body, 2, args=(items,), timeout_s=300)
    fixed, per_table = {}, {}
    for k, kind in enumerate(kinds):
        small, large = (max(rank[2 * k + j] for rank in times) for j in range(2))
        slope = max((large - small) / (sizes[1] - sizes[0]), 0.0)
        per_table[kind] = slope
        fixed[kind] = max(small - slope * sizes[0], 0.0)
    return fixed, per_table


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
        fwd_bw, bwd_bw = measure_kernels(dims, repeats=3 if quick else 5)
        memory_bw = measure_memory_bandwidth(64 if quick else 256)
    finally:
        torch.set_num_threads(threads)
    collective_bw, latency = measure_collectives(
        large_bytes=(4 if quick else 16) * 2**20, repeats=3 if quick else 7)
    try:
        overheads, per_table = measure_sharding_overheads(steps=5 if quick else 10)
    except ImportError as exc:  # the sharded module is not available: latency model only
        logger.warning("sharding overheads not measured (%s)", exc)
        overheads, per_table = {}, {}
    seconds = time.perf_counter() - start
    topology = Topology.preset(
        "cpu", world_size=2, local_world_size=2, ddr_bytes=_memory_total() / 2,
        ddr_bw=memory_bw,
        intra_host_bw=collective_bw["all_to_all"], kernel_fwd_bw=fwd_bw,
        kernel_bwd_bw=bwd_bw, collective_bw=collective_bw, collective_latency_s=latency,
        sharding_overhead_s=overheads, sharding_overhead_per_table_s=per_table,
        calibrated={"host": os.uname().nodename, "seconds": seconds,
                    "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "threads_per_rank": 1, "torch": torch.__version__,
                    "host_memory_bytes": _memory_total(),
                    "kernel": _kernel_name()})
    if path is not None:
        topology.save(path)
    logger.info("calibrated in %.1f s", seconds)
    return topology


def _kernel_name() -> str:
    try:
        import fbgemm_gpu  # noqa: F401

        return "fbgemm SplitTableBatchedEmbeddingBagsCodegen (cpu, exact_rowwise_adagrad)"
    except ImportError:
        return "torch.nn.EmbeddingBag (sparse, sgd)"
