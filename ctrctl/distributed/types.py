"""The sharding plan: how each embedding table is split across ranks (``plan.json``).

A plan maps each table to a :class:`ParameterSharding`: a sharding type, a compute kernel and
the shards (which rank holds which block of rows and columns). Geometry follows TorchRec so
plans are comparable: row-wise blocks hold ``ceil(rows / n)`` rows; column-wise blocks split
the embedding dimension.

A table of 10 rows x dim 8 on 2 ranks::

    table_wise   rank0: rows 0-9, cols 0-7
    row_wise     rank0: rows 0-4, cols 0-7      rank1: rows 5-9, cols 0-7
    column_wise  rank0: rows 0-9, cols 0-3      rank1: rows 0-9, cols 4-7
    data_parallel  every rank: rows 0-9, cols 0-7 (a replica)

``table_row_wise`` is row-wise within the ranks of one host, ``table_column_wise`` places
column blocks table-wise (several blocks may share a rank).

Example:
    >>> plan = ShardingPlan.load("plan.json")
    >>> plan.validate({"C1": (1000, 64)}, world_size=2)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ctrctl.errors import FormatError, PlanError
from ctrctl.names import ComputeKernel, ShardingType

PLAN_FORMAT = "ctrctl.plan"
PLAN_FORMAT_VERSION = 1


def row_blocks(rows: int, n: int) -> list[tuple[int, int]]:
    """(row_offset, rows) of TorchRec's row-wise split of ``rows`` over ``n`` ranks.

    Blocks of ``ceil(rows / n)`` rows, the last one shorter; fewer than ``n`` blocks when the
    table has fewer rows than that (ranks past the last row hold nothing). The one place this
    rule is written: default plans, the planner's enumerator and the sharded modules agree.

    Example:
        >>> row_blocks(10, 4)
        [(0, 3), (3, 3), (6, 3), (9, 1)]
    """
    size = math.ceil(rows / n)
    return [(start, min(size, rows - start)) for start in range(0, rows, size)]


@dataclass(frozen=True)
class ShardMetadata:
    """One block of a table held by one rank."""

    rank: int
    row_offset: int
    col_offset: int
    rows: int
    cols: int

    @property
    def size(self) -> tuple[int, int]:
        return (self.rows, self.cols)


@dataclass(frozen=True)
class ParameterSharding:
    """How one table is sharded.

    Attributes:
        sharding_type: one of :class:`ShardingType`'s values.
        compute_kernel: one of :class:`ComputeKernel`'s values.
        num_embeddings, embedding_dim: the table's full size.
        shards: the blocks and their ranks (DP: one full block per rank).
        storage_bytes: the planner's estimate of memory over all shards (0 for hand plans).
        cost: the planner's estimates (e.g. ``fwd_compute``, ``bwd_compute``, ``comms``), in
            seconds per step.
        cache_load_factor: for cached kernels, the fraction of rows kept on the device.
    """

    sharding_type: str
    compute_kernel: str
    num_embeddings: int
    embedding_dim: int
    shards: tuple[ShardMetadata, ...]
    storage_bytes: int = 0
    cost: dict[str, float] = field(default_factory=dict)
    cache_load_factor: float | None = None

    @property
    def ranks(self) -> list[int]:
        return sorted({s.rank for s in self.shards})

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ranks"] = self.ranks
        data["shards"] = [asdict(s) for s in self.shards]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ParameterSharding:
        return cls(
            sharding_type=str(data["sharding_type"]),
            compute_kernel=str(data.get("compute_kernel", ComputeKernel.FUSED.value)),
            num_embeddings=int(data["num_embeddings"]),
            embedding_dim=int(data["embedding_dim"]),
            shards=tuple(ShardMetadata(**{k: int(v) for k, v in s.items()})
                         for s in data["shards"]),
            storage_bytes=int(data.get("storage_bytes", 0)),
            cost={k: float(v) for k, v in data.get("cost", {}).items()},
            cache_load_factor=data.get("cache_load_factor"),
        )


@dataclass(frozen=True)
class ShardingPlan:
    """Table name -> :class:`ParameterSharding`, with the topology it was made for.

    Attributes:
        world_size: number of ranks.
        local_world_size: ranks per host (for table_row_wise and intra/inter-host costs).
        tables: the per-table shardings.
        topology: the planner's topology (device kind, capacities, bandwidths) as a dict.
        ranks: per-rank totals from the planner (storage, cost), informational.
        metadata: anything else (planner version, batch size, estimate of the step time).
    """

    world_size: int
    local_world_size: int
    tables: dict[str, ParameterSharding]
    topology: dict[str, Any] = field(default_factory=dict)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    # ---- serialisation ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "format_version": PLAN_FORMAT_VERSION,
            "world_size": self.world_size,
            "local_world_size": self.local_world_size,
            "topology": self.topology,
            "tables": {name: ps.to_dict() for name, ps in sorted(self.tables.items())},
            "ranks": self.ranks,
            "metadata": self.metadata,
        }

    def save(self, path: str | Path) -> Path:
        from ctrctl.io import write_json_atomic

        write_json_atomic(path, self.to_dict())
        return Path(path)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "plan") -> ShardingPlan:
        if data.get("format") != PLAN_FORMAT:
            raise FormatError(
                f"not a ctrctl sharding plan (format={data.get('format')!r})",
                where=where,
                hint="write one with `ctrctl plan`",
            )
        if data.get("format_version") != PLAN_FORMAT_VERSION:
            raise FormatError(
                f"plan format version {data.get('format_version')} is not supported "
                f"(this ctrctl reads version {PLAN_FORMAT_VERSION})",
                where=where,
            )
        try:
            tables = {}
            for name, table in data["tables"].items():
                try:
                    tables[name] = ParameterSharding.from_dict(table)
                except (KeyError, TypeError, ValueError) as exc:
                    raise FormatError(f"table {name!r}: malformed entry ({exc!r})",
                                      where=where) from exc
            return cls(
                world_size=int(data["world_size"]),
                local_world_size=int(data.get("local_world_size", data["world_size"])),
                tables=tables,
                topology=data.get("topology", {}),
                ranks=data.get("ranks", []),
                metadata=data.get("metadata", {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"malformed plan: {exc!r}", where=where) from exc

    @classmethod
    def load(cls, path: str | Path) -> ShardingPlan:
        from ctrctl.io import read_json_file

        data = read_json_file(path, PlanError("plan file not found", where=str(path),
                                              hint="write one with `ctrctl plan`"))
        return cls.from_dict(data, where=str(path))

    # ---- validation ------------------------------------------------------------------
    def validate(
        self, tables: dict[str, tuple[int, int]], world_size: int | None = None,
        where: str = "plan",
    ) -> None:
        """Check the plan against the model's tables and the world it will run in.

        Args:
            tables: table name -> (num_embeddings, embedding_dim) of the model.
            world_size: the number of ranks that will run it (default: the plan's own).

        Raises:
            PlanError: naming the table and shard at fault and what to do.
        """
        world = self.world_size if world_size is None else world_size
        if world != self.world_size:
            raise PlanError(
                f"the plan is for world size {self.world_size} but {world} ranks run it",
                where=where, hint=f"plan again with --world-size {world}",
            )
        if not 1 <= self.local_world_size <= world or world % self.local_world_size:
            raise PlanError(
                f"local_world_size {self.local_world_size} does not divide world size {world}",
                where=where,
            )
        missing = sorted(set(tables) - set(self.tables))
        if missing:
            raise PlanError(f"tables missing from the plan: {', '.join(missing)}", where=where,
                            hint="plan again for this model, or add them by hand")
        extra = sorted(set(self.tables) - set(tables))
        if extra:
            raise PlanError(f"the plan names tables the model does not have: "
                            f"{', '.join(extra)}", where=where)
        for name, (rows, dim) in tables.items():
            _validate_table(name, self.tables[name], rows, dim, world,
                            self.local_world_size, where)


def _validate_table(
    name: str, ps: ParameterSharding, rows: int, dim: int, world: int, local: int, where: str
) -> None:
    at = f"{where}: table {name!r}"
    try:
        kind = ShardingType(ps.sharding_type)
    except ValueError:
        raise PlanError(f"unknown sharding type {ps.sharding_type!r}", where=at,
                        hint=f"use one of {[t.value for t in ShardingType]}") from None
    try:
        ComputeKernel(ps.compute_kernel)
    except ValueError:
        raise PlanError(f"unknown compute kernel {ps.compute_kernel!r}", where=at,
                        hint=f"use one of {[k.value for k in ComputeKernel]}") from None
    if (ps.num_embeddings, ps.embedding_dim) != (rows, dim):
        raise PlanError(
            f"the plan has {ps.num_embeddings} x {ps.embedding_dim} but the model's table is "
            f"{rows} x {dim}", where=at, hint="plan again for this dataset")
    if not ps.shards:
        raise PlanError("no shards", where=at)
    for s in ps.shards:
        if not 0 <= s.rank < world:
            raise PlanError(f"shard on rank {s.rank}, outside the world of {world} ranks",
                            where=at)
        if (s.rows <= 0 or s.cols <= 0 or s.row_offset < 0 or s.col_offset < 0
                or s.row_offset + s.rows > rows or s.col_offset + s.cols > dim):
            raise PlanError(
                f"shard rows {s.row_offset}..{s.row_offset + s.rows} x cols "
                f"{s.col_offset}..{s.col_offset + s.cols} lies outside the table "
                f"({rows} x {dim})", where=at)
    if kind is ShardingType.DATA_PARALLEL:
        if sorted(s.rank for s in ps.shards) != list(range(world)) or any(
            s.size != (rows, dim) for s in ps.shards
        ):
            raise PlanError("data_parallel needs one full replica on every rank", where=at)
        return
    # Non-replicated types: the shards tile the table exactly, no overlap, no gap.
    area = 0
    blocks = sorted(ps.shards, key=lambda s: (s.row_offset, s.col_offset))
    for i, a in enumerate(blocks):
        area += a.rows * a.cols
        for b in blocks[i + 1:]:
            if (a.row_offset < b.row_offset + b.rows and b.row_offset < a.row_offset + a.rows
                    and a.col_offset < b.col_offset + b.cols
                    and b.col_offset < a.col_offset + a.cols):
                raise PlanError(
                    f"shards on ranks {a.rank} and {b.rank} overlap (rows {b.row_offset}.., "
                    f"cols {b.col_offset}..)", where=at)
    if area != rows * dim:
        raise PlanError(f"the shards cover {area} of the table's {rows * dim} cells",
                        where=at, hint="shards must tile the whole table")
    full_rows = all(s.rows == rows for s in ps.shards)
    full_cols = all(s.cols == dim for s in ps.shards)
    if kind is ShardingType.TABLE_WISE and len(ps.shards) != 1:
        raise PlanError("table_wise places the whole table on one rank", where=at)
    if kind in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE) and not full_cols:
        raise PlanError(f"{kind.value} shards must span all columns", where=at)
    if kind in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE) and not full_rows:
        raise PlanError(f"{kind.value} shards must span all rows", where=at)
    if kind is ShardingType.ROW_WISE and len({s.rank for s in ps.shards}) != len(ps.shards):
        raise PlanError("row_wise places one row block per rank", where=at)
    if kind is ShardingType.TABLE_ROW_WISE:
        hosts = {s.rank // local for s in ps.shards}
        if len(hosts) != 1:
            raise PlanError(
                f"table_row_wise shards must stay within one host of {local} ranks "
                f"(found hosts {sorted(hosts)})", where=at)
