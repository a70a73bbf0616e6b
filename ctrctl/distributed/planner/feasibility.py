"""Capacity proofs that need no search: a table that fits no rank, tables that fit no world.

Two lower bounds on memory decide many refusals before any proposer runs:

* **per table**: a table fits only if one of its options has every shard within one rank's
  device and host memory;
* **in total**: every table takes at least its smallest option's bytes (device and host
  together), so the sum of those minima must fit the ranks' memory all together.

Both are sums and maxima over the enumerated options, so an infeasible request is refused at
the cost of the enumeration alone, with the same message (and the same hints: how many ranks
or how much more memory would do) as a failed search.

Example:
    >>> check_capacity(tables, options, topology)   # raises PlanError when proven infeasible
"""

from __future__ import annotations

import math

from ctrctl.distributed.planner.topology import GIB, Topology
from ctrctl.distributed.planner.types import ShardingOption, TableSpec
from ctrctl.errors import PlanError


def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def fits_one_rank(option: ShardingOption, topology: Topology) -> bool:
    """Whether each of the option's shards fits an empty rank."""
    return (float(option.hbm.max(initial=0.0)) <= topology.hbm_available
            and float(option.ddr.max(initial=0.0)) <= topology.ddr_available)


def capacity_hints(total_need: float, topology: Topology) -> list[str]:
    """What would hold ``total_need`` bytes: more ranks (whole hosts) or more memory per rank;
    or, when the total fits, twice the ranks."""
    world = topology.world_size
    per_rank = topology.hbm_available + topology.ddr_available
    if total_need <= per_rank * world:
        return [f"{world * 2} ranks would give twice the room"]
    more = math.ceil(total_need / max(per_rank, 1.0))
    local = topology.local_world_size
    more = math.ceil(more / local) * local if more > local else more
    return [f"all tables need at least {_gib(total_need)} but {world} ranks have "
            f"{_gib(per_rank * world)}: use at least {more} ranks "
            f"(--world-size auto finds the smallest that fits) or "
            f"{_gib(total_need / world - per_rank)} more memory per rank"]


def smallest_storage(options: list[ShardingOption], deferred: bool = True) -> float:
    """The fewest bytes (device and host, all shards) any of ``options`` takes.

    Args:
        deferred: also price the options whose pricing was deferred (slower kernels; on
            CPU the disk-backed kernel keeps only a fraction in memory). Without them the
            result bounds the smallest from above.
    """
    priced = [o.storage_bytes for o in options if o.pending is None]
    least = min(priced, default=math.inf)
    if deferred:
        for option in options:
            if option.pending is not None:
                least = min(least, option.storage_bytes)
    return least


def check_capacity(tables: list[TableSpec], options: list[list[ShardingOption]],
                   topology: Topology) -> None:
    """Refuse at once what no search could place.

    Raises:
        PlanError: a table none of whose options fits one rank (the same message a failed
            search gives), or tables whose smallest options together exceed all ranks'
            memory, with how many ranks or how much memory per rank would hold them.
    """
    from ctrctl.distributed.planner.partitioners import RankState
    from ctrctl.distributed.planner.planner import no_fit_error
    from ctrctl.distributed.planner.proposers import Failure

    smallest = []
    for index, opts in enumerate(options):
        fitting = any(fits_one_rank(o, topology) for o in opts if o.pending is None) or any(
            fits_one_rank(o.ensure_priced(), topology) for o in opts if o.pending is not None)
        if not fitting:
            raise no_fit_error(tables, options, topology, Failure(index, RankState(topology)))
        smallest.append(smallest_storage(opts, deferred=False))
    total = float(sum(smallest))
    world = topology.world_size
    capacity = (topology.hbm_available + topology.ddr_available) * world
    if total > capacity:  # settle it with the deferred options priced too
        smallest = [smallest_storage(opts) for opts in options]
        total = float(sum(smallest))
    check_total(len(tables), total, topology)
    for tier in ("hbm", "ddr"):
        tier_capacity = getattr(topology, f"{tier}_available") * world
        # The priced options' minima bound the true one from above: only when they do not
        # fit are the deferred options priced to settle it.
        if sum(_least_in_tier(opts, tier, False) for opts in options) <= tier_capacity:
            continue
        check_tier(len(tables), tier, sum(_least_in_tier(opts, tier, True) for opts in options),
                   topology)


def check_total(num_tables: int, total: float, topology: Topology) -> None:
    """Refuse when the tables' smallest options (``total`` bytes) exceed all memory."""
    world = topology.world_size
    capacity = (topology.hbm_available + topology.ddr_available) * world
    if total > capacity:
        raise PlanError(
            f"no plan fits: the {num_tables:,} tables need at least {_gib(total)} (each at "
            f"its smallest option, optimizer state included) but the ranks hold "
            f"{_gib(capacity)}", where=f"world size {world}",
            hint="; ".join(capacity_hints(total, topology)))


def check_tier(num_tables: int, tier: str, need: float, topology: Topology) -> None:
    """Refuse when the tables need more of ``tier`` at their leanest than all ranks have."""
    world = topology.world_size
    tier_capacity = getattr(topology, f"{tier}_available") * world
    if need > tier_capacity:
        raise PlanError(
            f"no plan fits: the {num_tables:,} tables need at least {_gib(need)} of "
            f"{tier} (each at its option taking the least {tier}, input and output "
            f"buffers included) but the ranks hold {_gib(tier_capacity)}",
            where=f"world size {world}",
            hint=f"{_gib(need / world - tier_capacity / world)} more {tier} per rank would "
                 "hold it, or a smaller batch per rank: a shard's input and output buffers "
                 "grow with the batch per rank times the ranks, so more ranks alone may not "
                 "help")


def _least_in_tier(options: list[ShardingOption], tier: str, deferred: bool) -> float:
    """The fewest bytes of ``tier`` any option takes (the deferred ones too if asked)."""
    priced = [float(getattr(o, tier).sum()) for o in options if o.pending is None]
    least = min(priced, default=math.inf)
    if deferred and least > 0:
        for option in options:
            if option.pending is not None:
                least = min(least, float(getattr(option.ensure_priced(), tier).sum()))
    return least
