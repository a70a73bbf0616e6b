"""The planner's vocabulary: tables to place, their constraints, and the options it weighs.

The planner is a pipeline of roles (as in TorchRec): an enumerator turns each
:class:`TableSpec` into :class:`ShardingOption` s (a sharding type, a kernel and the shape of
each shard), an estimator prices every shard (memory and seconds per step), a proposer picks
one option per table, a partitioner puts the shards on ranks, and the plan is rated by its
slowest rank. Everything here is plain data; nothing needs a process group or a device.

Example:
    >>> t = TableSpec("C1", num_embeddings=40_000_000, embedding_dim=128, pooling_factor=1.0)
    >>> t.weight_bytes / 2**30
    19.073486328125
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ctrctl.errors import PlanError
from ctrctl.names import ComputeKernel, ShardingType

#: Bits per element of every data type a table may be stored in, the serving-only
#: quantized types (INT4, INT2, FP8) included.
DATA_TYPE_BITS: dict[str, int] = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8, "fp8": 8,
                                  "int4": 4, "int2": 2}
#: Bytes a row-wise quantized row carries beside its values: an fp16 scale and an fp16 bias
#: (FBGEMM's INT8/INT4/INT2 inference rows).
QUANT_SCALE_BIAS_BYTES = 4
#: Optimizer state, as (floats per row, floats per element), all fp32.
OPTIMIZER_STATE: dict[str, tuple[float, float]] = {
    "sgd": (0.0, 0.0),
    "rowwise_adagrad": (1.0, 0.0),
    "adagrad": (0.0, 1.0),
    "adam": (0.0, 2.0),
    # FBGEMM's names (ctrctl.modules.optimizers) for the same and a few more.
    "exact_sgd": (0.0, 0.0),
    "exact_rowwise_adagrad": (1.0, 0.0),
    "exact_adagrad": (0.0, 1.0),
    "partial_rowwise_adam": (1.0, 1.0),
    "lamb": (0.0, 2.0),
    "partial_rowwise_lamb": (1.0, 1.0),
    "lars_sgd": (0.0, 1.0),
}
#: Bytes of one id on the wire and in the input buffers (int64).
INDEX_BYTES = 8


@dataclass(frozen=True)
class TableConstraints:
    """What a user allows for one table.

    Attributes:
        sharding_types: allowed :class:`ShardingType` values (None: every type).
        compute_kernels: allowed :class:`ComputeKernel` values (None: every kernel).
        min_col_block: narrowest column block for column-wise types (None: 32, or the
            dimension when it is smaller).
        ranks: the only ranks that may hold the table's shards (None: any rank).
        cache_load_factor: the fraction of rows a ``fused_uvm_caching`` table keeps on the
            device, or a ``fused_cached`` one in DRAM (None: the topology's default).
    """

    sharding_types: tuple[str, ...] | None = None
    compute_kernels: tuple[str, ...] | None = None
    min_col_block: int | None = None
    ranks: tuple[int, ...] | None = None
    cache_load_factor: float | None = None

    def __post_init__(self) -> None:
        for kind in self.sharding_types or ():
            if kind not in {t.value for t in ShardingType}:
                raise PlanError(f"unknown sharding type {kind!r} in the constraints",
                                hint=f"use one of {[t.value for t in ShardingType]}")
        for kernel in self.compute_kernels or ():
            if kernel not in {k.value for k in ComputeKernel}:
                raise PlanError(f"unknown compute kernel {kernel!r} in the constraints",
                                hint=f"use one of {[k.value for k in ComputeKernel]}")
        if self.cache_load_factor is not None and not 0 < self.cache_load_factor <= 1:
            raise PlanError(f"cache_load_factor {self.cache_load_factor} is not in (0, 1]")
        if self.min_col_block is not None and self.min_col_block <= 0:
            raise PlanError(f"min_col_block {self.min_col_block} must be positive")


@dataclass(frozen=True)
class TableSpec:
    """One embedding table as the planner sees it.

    Attributes:
        name: the table (feature) name.
        num_embeddings: rows.
        embedding_dim: columns.
        pooling_factor: mean ids per sample (``SparseFeature.mean_length``).
        data_type: ``fp32``, ``fp16``, ``bf16`` or ``int8`` weights; for serving plans
            also ``int4``, ``int2`` and ``fp8``.
        optimizer: ``sgd``, ``rowwise_adagrad``, ``adagrad`` or ``adam`` (its state counts).
        constraints: what the user allows for this table.
        scale_bias_bytes: bytes each row carries beside its values (row-wise quantized
            serving rows: :data:`QUANT_SCALE_BIAS_BYTES`; 0 for training tables).
        remap_bytes_per_row: a managed-collision table's remapper state per row (id -> slot
            index, counters, waiting ids), held by the ranks holding the rows (0: none).
        remap_ns_per_id: its training remap's time per id (nanoseconds), paid by the rank
            remapping the id (0: none).
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    pooling_factor: float = 1.0
    data_type: str = "fp32"
    optimizer: str = "rowwise_adagrad"
    constraints: TableConstraints = field(default_factory=TableConstraints)
    scale_bias_bytes: int = 0
    remap_bytes_per_row: float = 0.0
    remap_ns_per_id: float = 0.0

    def __post_init__(self) -> None:
        where = f"table {self.name!r}"
        if self.num_embeddings <= 0 or self.embedding_dim <= 0:
            raise PlanError(f"size {self.num_embeddings} x {self.embedding_dim} must be "
                            "positive", where=where)
        if self.pooling_factor < 0:
            raise PlanError(f"pooling factor {self.pooling_factor} is negative", where=where)
        if self.data_type not in DATA_TYPE_BITS:
            raise PlanError(f"unknown data type {self.data_type!r}", where=where,
                            hint=f"use one of {sorted(DATA_TYPE_BITS)}")
        if self.scale_bias_bytes < 0:
            raise PlanError(f"scale_bias_bytes {self.scale_bias_bytes} is negative",
                            where=where)
        if self.remap_bytes_per_row < 0 or self.remap_ns_per_id < 0:
            raise PlanError(f"remap_bytes_per_row {self.remap_bytes_per_row} and "
                            f"remap_ns_per_id {self.remap_ns_per_id} must be >= 0", where=where)
        if self.optimizer not in OPTIMIZER_STATE:
            raise PlanError(f"unknown optimizer {self.optimizer!r}", where=where,
                            hint=f"use one of {sorted(OPTIMIZER_STATE)}")

    @property
    def element_bytes(self) -> float:
        """Bytes per element (a fraction for the sub-byte types)."""
        return DATA_TYPE_BITS[self.data_type] / 8

    def row_bytes(self, cols: int | None = None) -> int:
        """Bytes of one row ``cols`` wide (default: the whole dim), scale and bias included."""
        width = self.embedding_dim if cols is None else cols
        return -(-width * DATA_TYPE_BITS[self.data_type] // 8) + self.scale_bias_bytes

    @property
    def weight_bytes(self) -> int:
        return self.num_embeddings * self.row_bytes()

    def state_bytes(self, rows: int, cols: int) -> float:
        """Optimizer state of a ``rows x cols`` block."""
        per_row, per_element = OPTIMIZER_STATE[self.optimizer]
        return 4.0 * (rows * per_row + rows * cols * per_element)


@dataclass
class ShardingOption:
    """One way to shard one table: a type, a kernel, and every shard's size and price.

    Shards are described by arrays (one entry per shard) so that a row-wise option over
    4,096 ranks costs a few numpy arrays, not 4,096 objects.

    Attributes:
        table: the table.
        sharding_type, compute_kernel: the choice.
        rows, cols, row_offsets, col_offsets: shard geometry, ``(k,)`` int64 each.
        fixed_ranks: ranks the shards must sit on (row_wise, data_parallel), else None.
        host_local: every shard must sit on one host (table_row_wise, table_column_wise);
            with ``fixed_ranks`` those are offsets within the host.
        cache_load_factor: for ``fused_uvm_caching`` and ``fused_cached``.
        fwd_compute, bwd_compute, fwd_comms, bwd_comms: seconds per step per shard, ``(k,)``.
        hbm, ddr: bytes per shard on the device and in host memory, ``(k,)``.
        pooled_bytes: bytes of the table's pooled vectors per rank and step (batch x dim),
            whatever the option: what assembling several sharding groups' outputs moves.
    """

    table: TableSpec
    sharding_type: str
    compute_kernel: str
    rows: np.ndarray
    cols: np.ndarray
    row_offsets: np.ndarray
    col_offsets: np.ndarray
    fixed_ranks: np.ndarray | None = None
    host_local: bool = False
    cache_load_factor: float | None = None
    fwd_compute: np.ndarray = field(default_factory=lambda: np.zeros(0))
    bwd_compute: np.ndarray = field(default_factory=lambda: np.zeros(0))
    fwd_comms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    bwd_comms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    hbm: np.ndarray = field(default_factory=lambda: np.zeros(0))
    ddr: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: bytes per shard on disk (``fused_cached``: the whole shard; empty for other kernels).
    disk: np.ndarray = field(default_factory=lambda: np.zeros(0))
    pooled_bytes: float = 0.0

    @property
    def num_shards(self) -> int:
        return int(self.rows.shape[0])

    #: Set by the enumerator for slower kernels: priced only when first needed.
    pending: Callable[[ShardingOption], None] | None = field(default=None, repr=False)

    def ensure_priced(self) -> ShardingOption:
        """Price the option now if the enumerator deferred it."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending(self)
        return self

    def finish_pricing(self) -> None:
        """Cache the per-shard totals once the estimator has filled the parts."""
        self._cost = self.fwd_compute + self.bwd_compute + self.fwd_comms + self.bwd_comms
        self._total_cost = float(self._cost.sum())
        self._storage = float(self.hbm.sum() + self.ddr.sum())

    def set_totals(self, cost: np.ndarray, total_cost: float, storage: float) -> None:
        """Cache totals the estimator already has."""
        self._cost, self._total_cost, self._storage = cost, total_cost, storage

    @property
    def cost(self) -> np.ndarray:
        """Seconds per step of each shard, ``(k,)``."""
        if not hasattr(self, "_cost"):
            self.ensure_priced()
            self.finish_pricing()
        return self._cost

    @property
    def total_cost(self) -> float:
        if not hasattr(self, "_total_cost"):
            self.ensure_priced()
            self.finish_pricing()
        return self._total_cost

    @property
    def storage_bytes(self) -> float:
        if not hasattr(self, "_storage"):
            self.ensure_priced()
            self.finish_pricing()
        return self._storage

    @property
    def label(self) -> str:
        return f"{self.sharding_type}/{self.compute_kernel}/{self.num_shards}"


@dataclass
class Placement:
    """An option put on ranks: ``ranks[i]`` holds shard ``i``."""

    option: ShardingOption
    ranks: np.ndarray


class Enumerator(abc.ABC):
    """Turns tables into the options a proposer may choose from."""

    @abc.abstractmethod
    def enumerate(self, table: TableSpec) -> list[ShardingOption]:
        """Every allowed option for ``table``, priced; possibly empty."""


class Estimator(abc.ABC):
    """Prices options: storage (``hbm``, ``ddr``) and seconds per step per shard.

    Its options share one geometry (sharding type and blocks) and differ only in kernel, so
    an estimator may price the shared part once.
    """

    @abc.abstractmethod
    def estimate(self, options: list[ShardingOption]) -> list[ShardingOption]:
        """The options, priced (in place; an option may defer its pricing, see
        :meth:`ShardingOption.ensure_priced`)."""


class Proposer(abc.ABC):
    """Searches the options of every table for the plan with the fastest slowest rank.

    A proposer chooses each table's option and its ranks together (the bound it minimises
    depends on where a shard goes), so there is no separate partitioner role.

    Attributes:
        failure: after a ``None`` proposal, why placement stopped (for the error message), or
            None.
    """

    failure: Any = None

    @abc.abstractmethod
    def propose(self, options: list[list[ShardingOption]]) -> list[Placement] | None:
        """One placement per table (same order as ``options``), or None when none fits."""
