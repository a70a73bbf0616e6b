"""Placing quantized tables on serving shards within a memory budget per device.

Serving costs differ from training's: one request at a time (``request_size`` candidates),
no optimizer state, no backward. A shard's memory is its tables' quantized bytes (each
table's block padded to a cache line); its cost per request is the bytes its lookups read
(pooling factor x candidates x row bytes). Tables are placed whole (table-wise), largest
cost first, each on the cheapest shard that still has room: the classic longest-first
greedy, which keeps the slowest shard within 4/3 of the best split.

The training planner (:mod:`ctrctl.distributed.planner`) prices fp32/fp16/int8 weights with
optimizer state and a backward pass; serving tables are INT4/INT2/FP8 too and have neither,
so the placement here prices them itself and writes the same kind of per-shard totals.

``serving_plan.json``::

    {"format": "ctrctl.serving_plan", "format_version": 1, "num_shards": 2,
     "device_memory_bytes": 1073741824, "request_size": 512,
     "shards": [{"shard": 0, "device": "cpu", "tables": ["C1", "C7"], "bytes": 123456,
                 "cost_bytes_per_request": 70000}, ...],
     "tables": {"C1": {"shard": 0, "dtype": "int8", "rows": 1000, "dim": 64,
                       "row_bytes": 68, "bytes": 68000}, ...}}

Example:
    >>> plan = place_tables(tables, num_shards=2, device_memory_bytes=2 * 2**30)
    >>> plan.shard_tables(0)          # ["C1", "C7", ...] in the model's order
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
) -> ServingPlan:
    """Place whole tables on ``num_shards`` shards, balancing lookup bytes per request.

    Args:
        tables: the quantized tables, in the model's order (kept inside each shard).
        num_shards: serving devices or hosts.
        device_memory_bytes: memory each shard may use for tables (None: unlimited).
        pooling_factors: mean ids per sample of each table (default 1).
        request_size: candidates per request.
        devices: the device of each shard (default "cpu").

    Raises:
        PlanError: when a table fits on no shard, saying by how much and what would help.
    """
    if num_shards < 1:
        raise PlanError(f"--shards {num_shards} must be at least 1")
    if num_shards > len(tables):
        raise PlanError(f"{num_shards} shards for {len(tables)} tables would leave shards "
                        "empty", hint=f"use at most {len(tables)} shards")
    devices = list(devices or ["cpu"] * num_shards)
    if len(devices) != num_shards:
        raise PlanError(f"{len(devices)} devices given for {num_shards} shards")
    factors = dict(pooling_factors or {})
    cost = {t.name: factors.get(t.name, 1.0) * request_size * t.row_bytes for t in tables}
    used = [0] * num_shards
    load = [0.0] * num_shards
    where: dict[str, int] = {}
    for t in sorted(tables, key=lambda t: (-cost[t.name], -t.nbytes, t.name)):
        size = block_bytes(t)
        fits = [s for s in range(num_shards)
                if device_memory_bytes is None or used[s] + size <= device_memory_bytes]
        if not fits:
            free = max(device_memory_bytes - u for u in used) if device_memory_bytes else 0
            raise PlanError(
                f"table {t.name!r} ({size / 2**20:.1f} MiB as {t.dtype}) fits on no shard: "
                f"the most room left is {free / 2**20:.1f} MiB of "
                f"{(device_memory_bytes or 0) / 2**30:.3f} GiB",
                where="serving placement",
                hint="add shards (--shards), raise --device-memory-gb or quantize the "
                     "largest tables further (--per-table NAME=int4)")
        best = min(fits, key=lambda s: (load[s], used[s], s))
        where[t.name] = best
        used[best] += size
        load[best] += cost[t.name]
    shards = [{"shard": s, "device": devices[s],
               "tables": [t.name for t in tables if where[t.name] == s],
               "bytes": used[s], "cost_bytes_per_request": load[s]}
              for s in range(num_shards)]
    entries = {t.name: {"shard": where[t.name], "dtype": t.dtype, "rows": t.num_embeddings,
                        "dim": t.embedding_dim, "row_bytes": t.row_bytes, "bytes": t.nbytes,
                        "features": list(t.feature_names)}
               for t in tables}
    return ServingPlan(num_shards=num_shards, tables=entries, shards=shards,
                       device_memory_bytes=device_memory_bytes, request_size=request_size)
