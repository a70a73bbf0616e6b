"""Placing quantized tables on serving shards: the planner in its serving cost mode.

Serving costs differ from training's: one request at a time (``request_size`` candidates),
no optimizer state, no backward. :func:`place_tables` hands the quantized tables to the
sharding planner (:mod:`ctrctl.distributed.planner.inference`): storage is each table's
quantized rows (values plus the per-row fp16 scale and bias of INT8/INT4/INT2, each block
padded to a cache line), the cost of a request is its forward lookups, and every shard has
``device_memory_bytes`` for tables. The planner's search (greedy bound + local search)
keeps the slowest shard's estimated seconds per request lowest within those budgets, and
its explanation (per shard, per table, what drives the slowest and the fullest shard, as
``ctrctl plan`` prints it) is saved with the plan under ``extra.placement``.

``serving_plan.json``::

    {"format": "ctrctl.serving_plan", "format_version": 1, "num_shards": 2,
     "device_memory_bytes": 1073741824, "request_size": 512,
     "shards": [{"shard": 0, "device": "cpu", "tables": ["C1", "C7"], "bytes": 123456,
                 "cost_bytes_per_request": 70000, "seconds_per_request": 1.2e-05}, ...],
     "tables": {"C1": {"shard": 0, "dtype": "int8", "rows": 1000, "dim": 64,
                       "row_bytes": 68, "bytes": 68000}, ...},
     "extra": {"placement": {"planner": "ctrctl-planner-1", "summary": {...},
                             "shards": [...], "tables": [...]}}}

Example:
    >>> plan = place_tables(tables, num_shards=2, device_memory_bytes=2 * 2**30)
    >>> plan.shard_tables(0)          # ["C1", "C7", ...] in the model's order
    >>> plan.extra["placement"]["summary"]["slowest_rank"]
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrctl.distributed.planner import (
    PlanResult,
    Topology,
    plan_summary,
    rank_rows,
    serving_planner,
    serving_table,
    serving_topology,
    table_rows,
)
from ctrctl.errors import FormatError, PlanError
from ctrctl.io import write_json_atomic
from ctrctl.modules.quant_embedding import CACHE_LINE, QuantTableSpec

SERVING_PLAN_FORMAT = "ctrctl.serving_plan"
SERVING_PLAN_VERSION = 1
#: Candidates scored per request when the caller does not say (one user, 512 items).
DEFAULT_REQUEST_SIZE = 512


def block_bytes(table: QuantTableSpec) -> int:
    """A table's bytes in a shard's buffer: its rows, padded to a cache line."""
    return -(-table.nbytes // CACHE_LINE) * CACHE_LINE


@dataclass
class ServingPlan:
    """Which shard serves which table, with each shard's memory and cost per request."""

    num_shards: int
    tables: dict[str, dict[str, Any]]
    shards: list[dict[str, Any]]
    device_memory_bytes: int | None = None
    request_size: int = DEFAULT_REQUEST_SIZE
    extra: dict[str, Any] = field(default_factory=dict)

    def shard_tables(self, shard: int) -> list[str]:
        return list(self.shards[shard]["tables"])

    def to_dict(self) -> dict[str, Any]:
        return {"format": SERVING_PLAN_FORMAT, "format_version": SERVING_PLAN_VERSION,
                "num_shards": self.num_shards, "device_memory_bytes": self.device_memory_bytes,
                "request_size": self.request_size, "shards": self.shards,
                "tables": self.tables, **({"extra": self.extra} if self.extra else {})}

    def save(self, path: str | Path) -> Path:
        """Write the plan as JSON, atomically."""
        write_json_atomic(Path(path), self.to_dict())
        return Path(path)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "serving_plan.json"
                  ) -> ServingPlan:
        if data.get("format") != SERVING_PLAN_FORMAT:
            raise FormatError(f"not a serving plan (format={data.get('format')!r})",
                              where=where)
        if data.get("format_version") != SERVING_PLAN_VERSION:
            raise FormatError(f"serving plan version {data.get('format_version')} is not "
                              f"supported (this ctrctl reads {SERVING_PLAN_VERSION})",
                              where=where)
        try:
            plan = cls(num_shards=int(data["num_shards"]), tables=dict(data["tables"]),
                       shards=list(data["shards"]),
                       device_memory_bytes=data.get("device_memory_bytes"),
                       request_size=int(data.get("request_size", DEFAULT_REQUEST_SIZE)),
                       extra=dict(data.get("extra", {})))
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"malformed serving plan: {exc!r}", where=where) from exc
        placed = [t for s in plan.shards for t in s["tables"]]
        if len(plan.shards) != plan.num_shards or sorted(placed) != sorted(plan.tables):
            raise FormatError("the serving plan's shards do not hold every table once",
                              where=where, hint="re-run ctrctl quantize")
        return plan

    @classmethod
    def load(cls, path: str | Path) -> ServingPlan:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise FormatError(f"cannot read the serving plan: {exc}", where=str(path)) from exc
        return cls.from_dict(data, where=str(path))


def place_tables(
    tables: Sequence[QuantTableSpec],
    num_shards: int = 1,
    device_memory_bytes: int | None = None,
    *,
    pooling_factors: Mapping[str, float] | None = None,
    request_size: int = DEFAULT_REQUEST_SIZE,
    devices: Sequence[str] | None = None,
    topology: Topology | None = None,
) -> ServingPlan:
    """Place whole tables on ``num_shards`` shards with the planner's serving cost mode.

    Args:
        tables: the quantized tables, in the model's order (kept inside each shard).
        num_shards: serving devices or hosts.
        device_memory_bytes: memory each shard may use for tables (None: unlimited).
        pooling_factors: mean ids per sample of each table (default 1).
        request_size: candidates per request.
        devices: the device of each shard (default "cpu"; all "cuda..." plans for GPUs).
        topology: measured figures of the serving machines (``ctrctl plan --calibrate``)
            to price lookups with; its memory and size are replaced by the arguments.

    Raises:
        PlanError: when the tables fit on no set of shards, saying which table, by how much
            and what would help.
    """
    if num_shards < 1:
        raise PlanError(f"--shards {num_shards} must be at least 1")
    if num_shards > len(tables):
        raise PlanError(f"{num_shards} shards for {len(tables)} tables would leave shards "
                        "empty", hint=f"use at most {len(tables)} shards")
    devices = list(devices or ["cpu"] * num_shards)
    if len(devices) != num_shards:
        raise PlanError(f"{len(devices)} devices given for {num_shards} shards")
    _check_room(tables, num_shards, device_memory_bytes)
    factors = dict(pooling_factors or {})
    kind = "cuda" if all(d.startswith("cuda") for d in devices) else "cpu"
    serving = serving_topology(num_shards, device_memory_bytes, kind, base=topology)
    specs = [serving_table(t.name, t.num_embeddings, t.embedding_dim, t.dtype,
                           float(factors.get(t.name, 1.0))) for t in tables]
    try:
        result = serving_planner(serving, request_size).plan(specs)
    except PlanError as exc:
        raise PlanError(f"the quantized tables fit on no placement over {num_shards} "
                        f"shard(s) of {_mib(device_memory_bytes)}: {exc.message}",
                        where="serving placement", hint=_ROOM_HINT) from exc
    where = {p.option.table.name: int(p.ranks[0]) for p in result.placements}
    by_name = {p.option.table.name: p.option for p in result.placements}
    shards = []
    for s in range(num_shards):
        names = [t.name for t in tables if where[t.name] == s]
        shards.append({
            "shard": s, "device": devices[s], "tables": names,
            "bytes": int(result.rank_hbm[s] + result.rank_ddr[s]),
            "cost_bytes_per_request": sum(factors.get(t.name, 1.0) * request_size
                                          * t.row_bytes for t in tables if t.name in names),
            "seconds_per_request": float(result.rank_total[s])})
    entries = {t.name: {"shard": where[t.name], "dtype": t.dtype, "rows": t.num_embeddings,
                        "dim": t.embedding_dim, "row_bytes": t.row_bytes, "bytes": t.nbytes,
                        "block_bytes": int(by_name[t.name].storage_bytes),
                        "features": list(t.feature_names)}
               for t in tables}
    return ServingPlan(num_shards=num_shards, tables=entries, shards=shards,
                       device_memory_bytes=device_memory_bytes, request_size=request_size,
                       extra={"placement": explain(result)})


_ROOM_HINT = ("add shards (--shards), raise --device-memory-gb or quantize the largest "
              "tables further (--per-table NAME=int4)")


def _mib(value: float | None) -> str:
    return "unlimited memory" if value is None else f"{value / 2**20:,.1f} MiB"


def _check_room(tables: Sequence[QuantTableSpec], num_shards: int,
                device_memory_bytes: int | None) -> None:
    """The two cases that need no search: a table larger than a shard, or all of them
    larger than all shards together."""
    if device_memory_bytes is None:
        return
    for t in tables:
        size = block_bytes(t)
        if size > device_memory_bytes:
            raise PlanError(
                f"table {t.name!r} ({size / 2**20:.2f} MiB as {t.dtype}) fits on no shard: "
                f"each has {device_memory_bytes / 2**20:.2f} MiB for tables",
                where="serving placement", hint=_ROOM_HINT)
    total = sum(block_bytes(t) for t in tables)
    if total > num_shards * device_memory_bytes:
        need = -(-total // device_memory_bytes)
        raise PlanError(
            f"the quantized tables need {total / 2**20:.2f} MiB but {num_shards} shard(s) "
            f"hold {num_shards * device_memory_bytes / 2**20:.2f} MiB",
            where="serving placement",
            hint=f"use at least {need} shards, or {_ROOM_HINT.split(', ', 1)[1]}")


def explain(result: PlanResult) -> dict[str, Any]:
    """The planner's explanation of a serving placement, as plain JSON-able data: the
    headline (:func:`plan_summary`), per shard and per table rows (``ctrctl plan``'s)."""
    return {"planner": result.plan.metadata.get("planner"),
            "cost_mode": "inference",
            "summary": plan_summary(result),
            "shards": rank_rows(result),
            "tables": table_rows(result)}
