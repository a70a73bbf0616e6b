"""The last resort when every greedy proposal runs out of memory: a bounded exhaustive search.

Greedy placement commits to one table at a time, so a tight packing it orders badly ends in
"no plan" although some assignment of the enumerated options fits. :class:`ExhaustiveProposer`
searches every option of every table and every distinct placement of its shards, depth
first, largest tables first, undoing a choice when a later table finds no room. It looks only
at memory: the plan it finds is then improved by the local search like any other proposal.
A budget on the placements it tries keeps it bounded on large sets; within the budget (a few
tables on a few ranks) it is complete, so the planner says "no plan" only when none exists.

Example:
    >>> placements = ExhaustiveProposer(topology).propose(options)   # None: none fits
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from ctrctl.distributed.planner.partitioners import RankState
from ctrctl.distributed.planner.proposers import Failure
from ctrctl.distributed.planner.topology import Topology
from ctrctl.distributed.planner.types import Placement, Proposer, ShardingOption

#: Placements tried before the search gives up (a few seconds of Python at most).
DEFAULT_BUDGET = 200_000


def _candidate_ranks(option: ShardingOption, topology: Topology) -> list[list[int]]:
    """Rank groups the option's free shards may use: all ranks, or each host's."""
    world, local = topology.world_size, topology.local_world_size
    pinned = option.table.constraints.ranks
    allowed = [r for r in range(world) if not pinned or r in pinned]
    if not option.host_local:
        return [allowed]
    groups = [[r for r in allowed if r // local == h] for h in range(world // local)]
    return [g for g in groups if g]


def placements_of(option: ShardingOption, topology: Topology) -> Iterator[np.ndarray]:
    """Every distinct placement of the option's shards (equal shards in rank order only)."""
    world, local = topology.world_size, topology.local_world_size
    pinned = option.table.constraints.ranks
    if option.fixed_ranks is not None and not option.host_local:  # row_wise, data_parallel
        if not pinned or set(option.fixed_ranks.tolist()) <= set(pinned):
            yield np.asarray(option.fixed_ranks)
        return
    if option.fixed_ranks is not None:  # table_row_wise: local rank i of one host
        for host in range(world // local):
            ranks = host * local + np.asarray(option.fixed_ranks)
            if not pinned or set(ranks.tolist()) <= set(pinned):
                yield ranks
        return
    k = option.num_shards
    alike = bool((option.hbm == option.hbm[0]).all() and (option.ddr == option.ddr[0]).all())
    for group in _candidate_ranks(option, topology):
        choices = (itertools.combinations_with_replacement(group, k) if alike
                   else itertools.product(group, repeat=k))
        for combination in choices:
            yield np.array(combination, dtype=np.int64)


class ExhaustiveProposer(Proposer):
    """Depth-first search over options and placements for any plan that fits memory.

    Args:
        topology: the ranks.
        budget: placements tried before giving up (``failure`` then says where it stopped).
    """

    def __init__(self, topology: Topology, budget: int = DEFAULT_BUDGET):
        self.topology = topology
        self.budget = budget
        self.failure: Failure | None = None
        self.exhausted = False

    def propose(self, options: list[list[ShardingOption]]) -> list[Placement] | None:
        topo = self.topology
        hbm = [0.0] * topo.world_size
        ddr = [0.0] * topo.world_size
        hbm_cap, ddr_cap = topo.hbm_available, topo.ddr_available
        priced = [sorted((o.ensure_priced() for o in opts), key=lambda o: o.storage_bytes)
                  for opts in options]
        order = sorted(range(len(options)),
                       key=lambda i: (-min((o.storage_bytes for o in priced[i]), default=0.0),
                                      i))
        chosen: list[Placement | None] = [None] * len(options)
        tries = self.budget
        self.exhausted = False

        def place(ranks: np.ndarray, option: ShardingOption, sign: float) -> bool:
            """Add (or with ``sign`` -1 take back) the shards; False when one overflows."""
            fits = True
            for rank, h, d in zip(ranks.tolist(), option.hbm.tolist(), option.ddr.tolist(),
                                  strict=True):
                hbm[rank] += sign * h
                ddr[rank] += sign * d
                fits = fits and hbm[rank] <= hbm_cap and ddr[rank] <= ddr_cap
            return fits

        def search(depth: int) -> bool:
            nonlocal tries
            if depth == len(order):
                return True
            index = order[depth]
            for option in priced[index]:
                for ranks in placements_of(option, topo):
                    tries -= 1
                    if tries < 0:
                        self.exhausted = True
                        return False
                    if place(ranks, option, 1.0) and search(depth + 1):
                        chosen[index] = Placement(option, ranks)
                        return True
                    place(ranks, option, -1.0)
                    if self.exhausted:
                        return False
            return False

        if search(0):
            self.failure = None
            return [p for p in chosen if p is not None]
        self.failure = Failure(order[0] if order else 0, RankState(topo))
        return None
