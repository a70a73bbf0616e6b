"""Explain a plan: per-rank and per-table tables, imbalance, what drives the worst ranks.

Plain data (lists of dicts) so the CLI renders them with rich, a notebook with pandas, and
MLflow stores them as JSON.

Example:
    >>> summary = plan_summary(result)
    >>> summary["slowest_rank"], summary["top_tables_slowest_rank"][:3]
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from ctrctl.distributed.planner.planner import _COST_KEYS, PlanResult


def rank_rows(result: PlanResult) -> list[dict[str, Any]]:
    """Per rank: memory used and capacity, estimated compute and comms, shards by type."""
    topo = result.topology
    shards: list[Counter[str]] = [Counter() for _ in range(topo.world_size)]
    for p in result.placements:
        for r in p.ranks.tolist():
            shards[r][p.option.sharding_type] += 1
    rows = []
    for r in range(topo.world_size):
        cost = result.rank_cost[r]
        rows.append({
            "rank": r,
            "hbm_bytes": float(result.rank_hbm[r]), "hbm_capacity": topo.hbm_available,
            "ddr_bytes": float(result.rank_ddr[r]), "ddr_capacity": topo.ddr_available,
            **{key: float(cost[j]) for j, key in enumerate(_COST_KEYS)},
            "total": float(cost.sum()),
            "shards": dict(sorted(shards[r].items())),
        })
    return rows


def table_rows(result: PlanResult) -> list[dict[str, Any]]:
    """Per table: type, kernel, ranks, memory and estimated cost (most expensive first)."""
    rows = []
    for p in result.placements:
        o = p.option
        ranks = sorted(set(p.ranks.tolist()))
        rows.append({
            "table": o.table.name, "rows": o.table.num_embeddings,
            "dim": o.table.embedding_dim, "pooling_factor": o.table.pooling_factor,
            "sharding_type": o.sharding_type, "compute_kernel": o.compute_kernel,
            "num_shards": o.num_shards, "ranks": ranks,
            "hbm_bytes": float(o.hbm.sum()), "ddr_bytes": float(o.ddr.sum()),
            **{key: float(getattr(o, key).sum()) for key in _COST_KEYS},
            "cost": o.total_cost,
        })
    return sorted(rows, key=lambda row: (-row["cost"], row["table"]))


def drivers(result: PlanResult, rank: int, by: str = "cost", top: int = 5
            ) -> list[dict[str, Any]]:
    """The tables that contribute most to ``rank``'s cost (``by="cost"``) or memory."""
    share: list[dict[str, Any]] = []
    for p in result.placements:
        on_rank = p.ranks == rank
        if not on_rank.any():
            continue
        o = p.option
        value = (float(o.cost[on_rank].sum()) if by == "cost"
                 else float(o.hbm[on_rank].sum() + o.ddr[on_rank].sum()))
        share.append({"table": o.table.name, "sharding_type": o.sharding_type, by: value})
    return sorted(share, key=lambda d: (-float(d[by]), str(d["table"])))[:top]


def memory_share(result: PlanResult) -> np.ndarray:
    """Per rank, the larger of its device and host memory use over capacity."""
    topo = result.topology
    shares = [used / cap for used, cap in ((result.rank_hbm, topo.hbm_available),
                                           (result.rank_ddr, topo.ddr_available)) if cap > 0]
    return np.maximum.reduce(shares) if shares else np.zeros(topo.world_size)


def plan_summary(result: PlanResult) -> dict[str, Any]:
    """The headline numbers and the drivers of the slowest and the fullest rank."""
    total = result.rank_total
    memory = result.rank_hbm + result.rank_ddr
    topo = result.topology
    share = memory_share(result)
    slowest = int(np.argmax(total)) if total.size else 0
    fullest = int(np.argmax(share)) if share.size else 0
    by_type = Counter(p.option.sharding_type for p in result.placements)
    return {
        "world_size": topo.world_size, "local_world_size": topo.local_world_size,
        "device": topo.device, "batch_size_per_rank": result.batch_size,
        # where the cost model's figures came from: this machine, or a preset's constants
        "figures": "calibrated" if topo.calibrated else "preset",
        "num_tables": len(result.placements),
        "estimated_step_seconds": result.step_time,
        "collective_overhead_seconds": result.overhead,
        "slowest_rank": slowest, "slowest_rank_seconds": float(total[slowest]),
        "mean_rank_seconds": float(total.mean()),
        "imbalance": result.imbalance,
        "fullest_rank": fullest, "fullest_rank_bytes": float(memory[fullest]),
        "fullest_rank_fraction": float(share[fullest]) if share.size else 0.0,
        "total_storage_bytes": float(memory.sum()),
        "tables_by_sharding_type": dict(sorted(by_type.items())),
        "planning_seconds": result.planning_seconds,
        "top_tables_slowest_rank": drivers(result, slowest, "cost"),
        "top_tables_fullest_rank": drivers(result, fullest, "memory"),
    }


def summary_metrics(result: PlanResult) -> dict[str, float]:
    """The numeric headline for MLflow."""
    summary = plan_summary(result)
    return {k: float(v) for k, v in summary.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}
