"""Capacity questions: the smallest world size that fits, and what more ranks would buy.

Candidate world sizes are 1, 2, 4, ... up to a host, then whole hosts (1, 2, 4, ... hosts,
refined by bisection between the last that failed and the first that fits). The batch is
either per rank (weak scaling: the global batch grows with the ranks) or global (strong
scaling: ``global_batch_size / W`` per rank).

Example:
    >>> fit = smallest_world_size(tables, Topology.preset("h100", 8), batch_size=512)
    >>> [(p.world_size, p.step_time) for p in sweep_world_sizes(tables, topo, 512, [8, 16])]
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from ctrctl.distributed.planner.planner import EmbeddingShardingPlanner, PlanResult
from ctrctl.distributed.planner.topology import Topology
from ctrctl.distributed.planner.types import TableSpec
from ctrctl.errors import PlanError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepPoint:
    """One world size: does a plan fit, its estimated step time, its fullest rank."""

    world_size: int
    fits: bool
    step_time: float = math.inf
    batch_size: int = 0
    samples_per_second: float = 0.0
    fullest_fraction: float = 0.0
    reason: str = ""


def _per_rank_batch(batch_size: int, global_batch: bool, world: int) -> int:
    return max(batch_size // world, 1) if global_batch else batch_size


def _try(tables: list[TableSpec], topology: Topology, batch_size: int, global_batch: bool,
         sharding_types: tuple[str, ...] | None) -> PlanResult | PlanError:
    per_rank = _per_rank_batch(batch_size, global_batch, topology.world_size)
    try:
        return EmbeddingShardingPlanner(topology, per_rank, sharding_types).plan(tables)
    except PlanError as exc:
        return exc


def _point(world: int, outcome: PlanResult | PlanError) -> SweepPoint:
    if isinstance(outcome, PlanError):
        return SweepPoint(world, False, reason=outcome.message)
    from ctrctl.distributed.planner.stats import memory_share

    step = outcome.step_time
    return SweepPoint(world, True, step, outcome.batch_size,
                      outcome.batch_size * world / step if step > 0 else math.inf,
                      float(memory_share(outcome).max()))


def candidate_world_sizes(local_world_size: int, max_world_size: int) -> list[int]:
    """1, 2, 4 ... within a host, then 1, 2, 4 ... whole hosts."""
    sizes = []
    w = 1
    while w < local_world_size and w <= max_world_size:
        sizes.append(w)
        w *= 2
    hosts = 1
    while hosts * local_world_size <= max_world_size:
        sizes.append(hosts * local_world_size)
        hosts *= 2
    return sizes


def smallest_world_size(tables: list[TableSpec], topology: Topology, batch_size: int,
                        global_batch: bool = False, max_world_size: int = 65536,
                        sharding_types: tuple[str, ...] | None = None,
                        ranks_per_host: int | None = None) -> PlanResult:
    """The plan at the smallest world size that fits ``tables``.

    Args:
        tables: the tables.
        topology: the kind of rank (its world size is ignored; ranks per host are kept).
        batch_size: per rank, or global when ``global_batch``.
        max_world_size: give up beyond this.
        ranks_per_host: ranks a host holds (default: the topology's local world size).

    Raises:
        PlanError: when nothing up to ``max_world_size`` fits (with the last reason).
    """
    local = ranks_per_host or topology.local_world_size
    previous_fail = 0
    last_error: PlanError | None = None
    for world in candidate_world_sizes(local, max_world_size):
        outcome = _try(tables, topology.with_world(world, min(local, world)), batch_size,
                       global_batch, sharding_types)
        if isinstance(outcome, PlanError):
            previous_fail, last_error = world, outcome
            continue
        if world <= local or previous_fail < local:
            return outcome
        # Bisect on whole hosts between the last failure and this fit.
        lo, hi, best = previous_fail // local, world // local, outcome
        while hi - lo > 1:
            mid = (lo + hi) // 2
            trial = _try(tables, topology.with_world(mid * local, local), batch_size,
                         global_batch, sharding_types)
            if isinstance(trial, PlanError):
                lo = mid
            else:
                hi, best = mid, trial
        return best
    raise PlanError(f"no world size up to {max_world_size} fits the tables",
                    hint=last_error.render() if last_error else None)


def sweep_world_sizes(tables: list[TableSpec], topology: Topology, batch_size: int,
                      world_sizes: list[int], global_batch: bool = False,
                      sharding_types: tuple[str, ...] | None = None,
                      ranks_per_host: int | None = None) -> list[SweepPoint]:
    """Plan at each world size and report the estimated step time and memory."""
    points = []
    local = ranks_per_host or topology.local_world_size
    for world in world_sizes:
        topo = topology.with_world(world, local if world % local == 0 else world)
        points.append(_point(world, _try(tables, topo, batch_size, global_batch,
                                         sharding_types)))
    return points
