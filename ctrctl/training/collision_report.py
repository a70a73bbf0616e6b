"""Statistics of managed-collision (zch) tables for MLflow and the end-of-training report.

A remapper's shards may live on several ranks: :func:`collision_metrics` sums their counters
over the group, so every rank calls it together and each gets the run's statistics.

Example:
    >>> metrics = collision_metrics(model)      # {} when no table is managed
    >>> metrics["zch.user.default_rate"]
"""

from __future__ import annotations

from torch import nn

from ctrctl.modules.collision_collection import ManagedCollisionCollection

__all__ = ["collision_metrics", "format_collision_report"]

#: The statistics reported per table, in report order.
REPORTED = ("occupancy", "lookups", "default_rate", "admissions", "evictions", "distinct_ids")


def collision_metrics(model: nn.Module) -> dict[str, float]:
    """``zch.<table>.<statistic>`` for every managed-collision table of ``model``."""
    out: dict[str, float] = {}
    for module in model.modules():
        if isinstance(module, ManagedCollisionCollection):
            for table, stats in module.stats().items():
                out.update({f"zch.{table}.{k}": float(stats[k]) for k in REPORTED})
    return out


def format_collision_report(metrics: dict[str, float]) -> str:
    """One line per table of :func:`collision_metrics` ("" when there is none)."""
    tables = sorted({k.split(".")[1] for k in metrics if k.startswith("zch.")})
    lines = []
    for t in tables:
        m = {k: metrics[f"zch.{t}.{k}"] for k in REPORTED}
        lines.append(f"  {t}: occupancy {m['occupancy']:.1%}, {m['lookups']:,.0f} lookups "
                     f"({m['default_rate']:.1%} to the default row), "
                     f"{m['admissions']:,.0f} admissions, {m['evictions']:,.0f} evictions, "
                     f"{m['distinct_ids']:,.0f} distinct ids")
    return "\n".join(lines)
