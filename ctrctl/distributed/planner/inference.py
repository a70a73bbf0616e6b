"""The serving cost mode: quantized tables priced for one request, no optimizer, no backward.

A serving shard holds only its tables' quantized rows: the values (INT8/INT4/INT2/FP8/FP16)
plus, for the row-wise quantized integer types, an fp16 scale and an fp16 bias per row,
each table's block aligned to a cache line as FBGEMM lays them out. There is no optimizer
state, no gradient and no second batch in flight; the request's ids and pooled vectors are
activations, counted with the dense part in the memory the caller keeps aside (the
topology's ``reserved_fraction`` / ``dense_bytes``), not against the tables' budget.

A request of ``B`` candidates costs each shard the forward lookup of its tables only, with
``P`` ids per candidate, ``c`` columns and ``r`` bytes per stored row::

    lookup bytes = B * P * 8 (ids) + B * P * r (rows read) + B * c * 4 (fp32 pooled out)

over the kernel's forward bandwidth (the topology's, measured by calibration or TorchRec's
constants), plus, when the shards are separate devices, the ids sent to the shard and the
pooled vectors sent back over the link. Serving shards hold whole tables (table_wise, the
one layout the serving model runs), so the planner's search balances the slowest shard's
seconds per request within every shard's memory.

Example:
    >>> topology = serving_topology(2, device_memory_bytes=2 * 2**30)
    >>> planner = serving_planner(topology, request_size=512)
    >>> result = planner.plan([serving_table("C1", 1_000_000, 64, "int8"),
    ...                        serving_table("C2", 40_000, 64, "int4")])
    >>> result.rank_ddr            # bytes per shard: quantized rows + scale/bias, padded
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from ctrctl.distributed.planner.estimators import kernel_bandwidth
from ctrctl.distributed.planner.planner import EmbeddingShardingPlanner
from ctrctl.distributed.planner.topology import Topology
from ctrctl.distributed.planner.types import (
    DATA_TYPE_BITS,
    INDEX_BYTES,
    QUANT_SCALE_BIAS_BYTES,
    Estimator,
    Proposer,
    ShardingOption,
    TableConstraints,
    TableSpec,
)
from ctrctl.errors import PlanError
from ctrctl.names import ComputeKernel, ShardingType

#: Each table's block starts on a cache line (FBGEMM's inference TBE aligns to 128 bytes).
BLOCK_ALIGNMENT = 128
#: The pooled vectors a lookup writes are fp32.
OUTPUT_BYTES = 4
#: Memory per shard when the caller sets no budget: large enough never to bind.
UNLIMITED_BYTES = float(2**62)
#: The quantized types that carry a row-wise scale and bias.
ROWWISE_QUANTIZED = ("int8", "int4", "int2")
#: The layout and kernel serving shards run.
SERVING_SHARDING = (ShardingType.TABLE_WISE.value,)
SERVING_KERNELS = (ComputeKernel.FUSED.value,)


def serving_table(name: str, num_embeddings: int, embedding_dim: int, dtype: str,
                  pooling_factor: float = 1.0) -> TableSpec:
    """A quantized table as the serving planner sees it: its stored type, no optimizer.

    Args:
        name: the table.
        num_embeddings, embedding_dim: its shape.
        dtype: ``int8``, ``int4``, ``int2``, ``fp8``, ``fp16`` (or ``fp32``).
        pooling_factor: mean ids per candidate.
    """
    if dtype not in DATA_TYPE_BITS or dtype == "bf16":
        raise PlanError(f"unknown serving table type {dtype!r}", where=f"table {name!r}",
                        hint="use int8, int4, int2, fp8, fp16 or fp32")
    return TableSpec(
        name, num_embeddings, embedding_dim, pooling_factor=pooling_factor, data_type=dtype,
        optimizer="sgd",
        constraints=TableConstraints(sharding_types=SERVING_SHARDING,
                                     compute_kernels=SERVING_KERNELS),
        scale_bias_bytes=QUANT_SCALE_BIAS_BYTES if dtype in ROWWISE_QUANTIZED else 0)


def serving_topology(num_shards: int, device_memory_bytes: float | None = None,
                     device: str = "cpu", local_world_size: int | None = None,
                     base: Topology | None = None) -> Topology:
    """Serving devices: ``num_shards`` of them, each with ``device_memory_bytes`` for tables.

    Args:
        num_shards: serving devices or hosts.
        device_memory_bytes: table memory per device (None: unlimited). All of it goes to
            tables: the request's activations and the dense part are the caller's reserve.
        device: ``cpu`` (tables in host memory) or ``cuda`` (in device memory).
        local_world_size: devices per host (default: all on one host).
        base: measured figures to start from (a calibrated topology), else the ``cpu``
            preset or TorchRec's GPU constants.
    """
    if num_shards < 1:
        raise PlanError(f"{num_shards} serving shards: there must be at least one")
    memory = UNLIMITED_BYTES if device_memory_bytes is None else float(device_memory_bytes)
    if memory <= 0:
        raise PlanError(f"device memory {memory:g} bytes must be positive",
                        hint="pass a positive --device-memory-gb")
    tier: dict[str, Any] = ({"hbm_bytes": memory} if device == "cuda"
                            else {"hbm_bytes": 0.0, "ddr_bytes": memory})
    if base is not None:
        return dataclasses.replace(base.with_world(num_shards, local_world_size),
                                   device=device, reserved_fraction=0.0, dense_bytes=0.0,
                                   **tier)
    return Topology.preset("cpu" if device == "cpu" else "torchrec", num_shards,
                           local_world_size or num_shards, reserved_fraction=0.0, **tier)


def price_for_serving(option: ShardingOption, topology: Topology, request_size: int,
                      block_alignment: int = BLOCK_ALIGNMENT) -> ShardingOption:
    """Fill ``option``'s storage and forward cost for one request; returns it.

    Args:
        option: an option with its geometry set.
        topology: the serving devices.
        request_size: candidates per request.
        block_alignment: bytes each shard's block is padded to.
    """
    table = option.table
    kind = ShardingType(option.sharding_type)
    rows = option.rows.astype(np.float64)
    cols = option.cols.astype(np.float64)
    world, local = topology.world_size, topology.local_world_size
    pooling = float(table.pooling_factor)
    if kind in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
        n_ids = request_size * pooling * rows / table.num_embeddings
    else:
        n_ids = np.full_like(rows, request_size * pooling)
    bits = DATA_TYPE_BITS[table.data_type]
    row_bytes = np.ceil(cols * bits / 8) + table.scale_bias_bytes
    ids_bytes = n_ids * INDEX_BYTES
    out_bytes = request_size * cols * OUTPUT_BYTES
    lookup = ids_bytes + n_ids * row_bytes + out_bytes
    weights = np.ceil(rows * row_bytes / block_alignment) * block_alignment
    bandwidth = kernel_bandwidth(topology, option.compute_kernel, cols,
                                 option.cache_load_factor, shard_bytes=weights)
    zeros = np.zeros_like(rows)
    option.fwd_compute = lookup / bandwidth
    option.bwd_compute = zeros.copy()
    option.bwd_comms = zeros.copy()
    if world > 1 and kind is not ShardingType.DATA_PARALLEL:
        local_share = (local - 1) / (world - 1)
        remote = (world - 1) / world
        option.fwd_comms = (ids_bytes + out_bytes) * remote / topology.comm_bw(
            "all_to_all", local_share)
    else:
        option.fwd_comms = zeros.copy()
    if topology.device == "cuda":
        option.hbm, option.ddr = weights, zeros.copy()
    else:
        option.hbm, option.ddr = zeros.copy(), weights
    option.pooled_bytes = float(request_size * table.embedding_dim * OUTPUT_BYTES)
    option.finish_pricing()
    return option


class InferenceEstimator(Estimator):
    """The serving cost mode (see the module docstring) as the planner's estimator role.

    Args:
        topology: the serving devices.
        request_size: candidates per request.
        block_alignment: bytes each table's block is padded to.
    """

    def __init__(self, topology: Topology, request_size: int,
                 block_alignment: int = BLOCK_ALIGNMENT):
        if request_size <= 0:
            raise PlanError(f"request size {request_size} must be positive")
        self.topology = topology
        self.request_size = request_size
        self.block_alignment = block_alignment

    def estimate(self, options: list[ShardingOption]) -> list[ShardingOption]:
        return [price_for_serving(o, self.topology, self.request_size, self.block_alignment)
                for o in options]


def serving_planner(topology: Topology, request_size: int,
                    proposers: Sequence[Proposer] | None = None,
                    estimator: Estimator | None = None) -> EmbeddingShardingPlanner:
    """The planner in its serving cost mode: whole tables, priced by :class:`InferenceEstimator`.

    Args:
        topology: the serving devices (:func:`serving_topology`).
        request_size: candidates per request (the planner's batch).
        proposers: searches to run (default: the planner's).
        estimator: another serving estimator (default: :class:`InferenceEstimator`).
    """
    return EmbeddingShardingPlanner(
        topology, batch_size=request_size, sharding_types=SERVING_SHARDING,
        estimator=estimator or InferenceEstimator(topology, request_size),
        proposers=proposers)
