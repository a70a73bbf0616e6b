"""Memory-aware choice of options: give up speed where it costs the most memory per second.

The greedy search prices an option by the time it saves, not by the memory it takes from
the tables still to place. Two choices take much memory for little time:

* a data-parallel replica costs its whole size on *every* rank: with thousands of small
  tables the replicas alone can fill each rank, and the large tables placed after them find
  no room (a "no plan" for a model that needs a thousandth of the cluster);
* the ``fused`` kernel keeps weights and optimizer state in device memory where
  ``fused_uvm`` or ``fused_uvm_caching`` would keep them in host memory.

The repair (rather than a fixed replication budget, which would need tuning per model and
would cap replication even where memory is plentiful): when a search fails, find the
memory tier that ran out, rank the tables by the seconds their fastest option saves per
byte of that tier over their leanest option, and search again with the tables that save
least per byte restricted to their leanest options (a replicated table becomes sharded, a
device table moves to host memory): first an eighth of them, then a quarter, a half, all.
So the planner tries at most four more searches, and keeps fast, memory-hungry options
where they buy the most.

Example:
    >>> for restricted in leaner_options(options, topology, tier="hbm"):
    ...     placements = proposer.propose(restricted)
"""

from __future__ import annotations

from collections.abc import Iterator

from ctrctl.distributed.planner.partitioners import RankState
from ctrctl.distributed.planner.topology import Topology
from ctrctl.distributed.planner.types import ShardingOption

#: Shares of the tables restricted to their leanest options, one search each.
ROUNDS = (0.125, 0.25, 0.5, 1.0)


def full_tier(state: RankState) -> str:
    """The memory tier (``hbm`` or ``ddr``) closest to full on its fullest rank."""
    shares = {}
    for tier in ("hbm", "ddr"):
        cap = getattr(state, f"{tier}_cap")
        used = getattr(state, tier)
        shares[tier] = float((used / cap).max()) if float(cap.max(initial=0.0)) > 0 else -1.0
    return max(shares, key=lambda t: shares[t])


def footprint(option: ShardingOption, tier: str) -> float:
    """Bytes of ``tier`` the option takes on all ranks together."""
    return float(getattr(option.ensure_priced(), tier).sum())


def lean(options: list[ShardingOption], tier: str) -> list[ShardingOption]:
    """The options that take the least of ``tier`` (within 1%), fastest first."""
    least = min(footprint(o, tier) for o in options)
    kept = [o for o in options if footprint(o, tier) <= least * 1.01 + 1.0]
    return sorted(kept, key=lambda o: o.total_cost)


def seconds_per_byte(options: list[ShardingOption], tier: str) -> float:
    """What the fastest option saves over the leanest, per byte of ``tier`` it adds
    (infinite when the leanest is also the fastest: nothing to give up)."""
    fastest = min(options, key=lambda o: o.total_cost)
    leanest = lean(options, tier)[0]
    extra = footprint(fastest, tier) - footprint(leanest, tier)
    if extra <= 0:
        return float("inf")
    return (leanest.total_cost - fastest.total_cost) / extra


def leaner_options(options: list[list[ShardingOption]], topology: Topology, tier: str
                   ) -> Iterator[list[list[ShardingOption]]]:
    """Option sets with ever more tables restricted to their leanest options in ``tier``."""
    value = {i: seconds_per_byte(opts, tier) for i, opts in enumerate(options) if opts}
    ranked = sorted((i for i in value if value[i] != float("inf")),
                    key=lambda i: (value[i], i))  # least saved per byte first
    if not ranked:
        return
    done = 0
    for share in ROUNDS:
        count = max(1, round(share * len(ranked)))
        if count <= done:
            continue
        done = count
        restricted = set(ranked[:count])
        yield [lean(opts, tier) if i in restricted else opts
               for i, opts in enumerate(options)]
