"""Search: choose one option per table and place it, minimising the slowest rank.

Two stages, both deterministic:

1. :class:`GreedyProposer` walks the tables from the most to the least expensive (or the
   largest first when memory is tight) and gives each the option and placement with the best
   *bound* on the final slowest rank: ``max(new slowest touched rank, (work so far + this
   option + the cheapest work still to place) / world_size)``. Early on the average term
   dominates, so cheap table-wise options win (LPT scheduling); once a table would stick out
   above the average, row- or column-wise options that spread it win instead.
2. :func:`improve` (local search) repeatedly looks at the slowest rank and tries to bring
   it down: re-place one of its tables with any of that table's options (a move, or a change
   of sharding type or kernel) or swap one of its table-wise shards with a cheaper one on a
   lightly loaded rank. A change is kept only when every rank it touches ends strictly
   below the old maximum, so each step lowers the maximum or the number of ranks at it.

TorchRec's greedy proposer picks each table's fastest option and places it; the bound and
the local search are what this planner adds.

Example:
    >>> placements = GreedyProposer(topology).propose(options)
    >>> placements = improve(placements, options, topology)
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

import numpy as np

from ctrctl.distributed.planner.estimators import step_overhead
from ctrctl.distributed.planner.partitioners import RankState, best_placement
from ctrctl.distributed.planner.topology import Topology
from ctrctl.distributed.planner.types import Placement, Proposer, ShardingOption
from ctrctl.names import ShardingType

logger = logging.getLogger(__name__)

#: Relative tolerance under which two loads count as equal.
_EPS = 1e-9


@dataclass
class Failure:
    """Why greedy placement stopped: the table that found no room, and the state then."""

    table_index: int
    state: RankState


def _candidates(options: list[ShardingOption], state: RankState, world: float,
                remaining: float, current_max: float, types: Counter[str],
                pooled_bytes: float = 0.0
                ) -> tuple[tuple[float, float, float], Placement] | None:
    """The best placement over ``options`` by the bound, or None when none fits.

    The bound includes the fixed latency of the collectives of every sharding type in use,
    so a new type must pay for its own collectives."""
    topology = state.topology
    # Ranks that share cores do not add up: the work spreads over the ranks' worth the
    # hosts do at once.
    world = min(world, topology.num_hosts * topology.parallel_ranks)
    best: tuple[tuple[float, float, float], Placement] | None = None
    feasible_shapes: set[tuple[str, int]] = set()
    for option in options:
        shape = (option.sharding_type, option.num_shards)
        if shape in feasible_shapes:
            continue  # a faster kernel already fits this shape
        placement = best_placement(state, option)
        if placement is None:
            continue
        feasible_shapes.add(shape)
        touched = _touched_max(state, placement)
        bound = max(current_max, touched,
                    (state.total + option.total_cost + remaining) / world
                    ) + step_overhead(types + Counter({option.sharding_type: 1}), topology,
                                      pooled_bytes)
        score = (bound, option.total_cost, touched)
        if best is None or score < best[0]:
            best = (score, placement)
    return best


def _pooled_bytes(options: list[list[ShardingOption]]) -> float:
    """Bytes of all tables' pooled vectors per rank (the same for every option of a table)."""
    return sum(opts[0].pooled_bytes for opts in options if opts)


def _touched_max(state: RankState, placement: Placement) -> float:
    """The highest load among the ranks ``placement`` touches, once it is added."""
    option, ranks = placement.option, placement.ranks
    if option.fixed_ranks is not None:  # distinct ranks
        return float((state.load[ranks] + option.cost).max())
    if option.num_shards == 1:
        return float(state.load[ranks[0]] + option.cost[0])
    unique, inverse = np.unique(ranks, return_inverse=True)
    return float((state.load[unique] + np.bincount(inverse, weights=option.cost)).max())


class GreedyProposer(Proposer):
    """One pass over the tables, each placed where the bound on the slowest rank is lowest.

    Args:
        topology: the ranks.
        order: ``cost`` (most expensive table first) or ``memory`` (largest first).
    """

    def __init__(self, topology: Topology, order: str = "cost"):
        self.topology = topology
        self.order = order
        self.failure: Failure | None = None

    def propose(self, options: list[list[ShardingOption]]) -> list[Placement] | None:
        world = self.topology.world_size
        state = RankState(self.topology)
        # Deferred (slower-kernel) options are never the cheapest, nor much smaller.
        cheapest = [min((o.total_cost for o in opts if o.pending is None), default=0.0)
                    for opts in options]
        smallest = [min((o.storage_bytes for o in opts if o.pending is None), default=0.0)
                    for opts in options]
        key = cheapest if self.order == "cost" else smallest
        order = sorted(range(len(options)), key=lambda i: (-key[i], i))
        remaining = float(sum(cheapest))
        placements: list[Placement | None] = [None] * len(options)
        current_max = 0.0
        types: Counter[str] = Counter()
        pooled = _pooled_bytes(options)
        for index in order:
            remaining -= cheapest[index]
            best = _candidates(options[index], state, world, remaining, current_max, types,
                               pooled)
            if best is None:
                self.failure = Failure(index, state)
                return None
            placement = best[1]
            state.add(placement)
            current_max = max(current_max, float(state.load[placement.ranks].max()))
            types[placement.option.sharding_type] += 1
            placements[index] = placement
        self.failure = None
        return [p for p in placements if p is not None]


class FastestOptionProposer(Proposer):
    """TorchRec's first proposal: each table's fastest option, the most expensive first,
    each on the least-loaded rank with room; a table whose fastest option finds no room
    takes its next fastest. A starting point for :func:`improve`.

    Args:
        topology: the ranks.
    """

    def __init__(self, topology: Topology):
        self.topology = topology
        self.failure: Failure | None = None

    def propose(self, options: list[list[ShardingOption]]) -> list[Placement] | None:
        state = RankState(self.topology)
        ranked = [sorted((o for o in opts if o.pending is None), key=lambda o: o.total_cost)
                  + [o for o in opts if o.pending is not None] for opts in options]
        order = sorted(range(len(options)),
                       key=lambda i: (-(ranked[i][0].total_cost if ranked[i] else 0.0), i))
        placements: list[Placement | None] = [None] * len(options)
        for index in order:
            for option in ranked[index]:
                placement = best_placement(state, option)
                if placement is not None:
                    break
            else:
                self.failure = Failure(index, state)
                return None
            state.add(placement)
            placements[index] = placement
        self.failure = None
        return [p for p in placements if p is not None]


def improve(placements: list[Placement], options: list[list[ShardingOption]],
            topology: Topology, max_rounds: int | None = None,
            max_evaluations: int = 20_000, pooled: float | None = None) -> list[Placement]:
    """Local search on the slowest rank (see the module docstring); returns new placements.

    Args:
        placements: one per table, as a proposer returned them.
        options: every table's options (same order).
        topology: the ranks.
        max_rounds: cap on improving steps (default: 4 per table, at least 200).
        max_evaluations: cap on placements tried in all.
        pooled: every table's pooled bytes per rank (default: from ``options``; pass it
            when ``options`` builds each table's list only on demand).
    """
    placements = list(placements)
    state = RankState(topology)
    for placement in placements:
        state.add(placement)
    rounds = max_rounds if max_rounds is not None else max(200, 4 * len(placements))
    # A deterministic cap on work (placements tried), so a plan of thousands of tables on
    # thousands of ranks stays within seconds however many moves keep paying off.
    budget = max_evaluations
    # Which tables touch which rank: tables with a few shards by rank, spread ones apart.
    by_rank: dict[int, set[int]] = {}
    spread: set[int] = set()

    def index_add(i: int) -> None:
        p = placements[i]
        if p.option.fixed_ranks is not None and not p.option.host_local:
            spread.add(i)
        else:
            for r in set(p.ranks.tolist()):
                by_rank.setdefault(r, set()).add(i)

    def index_remove(i: int) -> None:
        spread.discard(i)
        for r in set(placements[i].ranks.tolist()):
            by_rank.get(r, set()).discard(i)

    for i in range(len(placements)):
        index_add(i)

    type_counts = Counter(p.option.sharding_type for p in placements)
    if pooled is None:
        pooled = _pooled_bytes(options)
    for _ in range(rounds):
        slowest = int(np.argmax(state.load))
        top = float(state.load[slowest])
        limit = top * (1 - _EPS) - 1e-15
        overhead = step_overhead(type_counts, topology, pooled)
        objective = top + overhead
        tables = sorted(by_rank.get(slowest, set()) | {i for i in spread
                                                        if slowest in placements[i].ranks},
                        key=lambda i: (-float(placements[i].option.cost[
                            placements[i].ranks == slowest].sum()), i))
        changed = False
        for i in tables:
            old = placements[i]
            state.remove(old)
            type_counts[old.option.sharding_type] -= 1
            others = +type_counts  # without zero counts
            best: tuple[tuple[float, float], Placement] | None = None
            fitting_shapes: set[tuple[str, int]] = set()
            for option in options[i]:
                shape = (option.sharding_type, option.num_shards)
                if shape in fitting_shapes and option.pending is not None:
                    continue  # a faster kernel of this shape fits: the slower one cannot win
                budget -= 1
                found = best_placement(state, option)
                if found is None:
                    continue
                fitting_shapes.add(shape)
                placement = found
                after = state.load.copy()
                np.add.at(after, placement.ranks, option.cost)
                touched = float(after[placement.ranks].max())
                new_overhead = step_overhead(others + Counter({option.sharding_type: 1}),
                                             topology, pooled)
                if new_overhead > overhead:
                    # A new sharding type adds collectives: only worth it if the step gets
                    # faster as a whole.
                    if float(after.max()) + new_overhead >= objective * (1 - _EPS):
                        continue
                elif new_overhead < overhead and \
                        float(after.max()) + new_overhead < objective * (1 - _EPS):
                    pass  # one type fewer and a faster step
                elif touched >= limit or after[slowest] >= limit:
                    continue
                score = (touched + new_overhead, option.total_cost)
                if best is None or score < best[0]:
                    best = (score, placement)
            if best is None:
                state.add(old)
                type_counts[old.option.sharding_type] += 1
                continue
            index_remove(i)
            placements[i] = best[1]
            state.add(best[1])
            type_counts[best[1].option.sharding_type] += 1
            index_add(i)
            changed = True
            break
        if budget <= 0:
            logger.debug("local search stopped at its evaluation budget")
            break
        if not changed:
            changed = _swap(state, placements, by_rank, slowest, limit, index_add,
                            index_remove)
        if not changed:
            break
    return placements


def _swap(state: RankState, placements: list[Placement], by_rank: dict[int, set[int]],
          slowest: int, limit: float, index_add: object, index_remove: object) -> bool:
    """Swap a table-wise table on the slowest rank with a cheaper one on a light rank."""
    table_wise = ShardingType.TABLE_WISE.value
    mine = [i for i in sorted(by_rank.get(slowest, set()))
            if placements[i].option.sharding_type == table_wise]
    if not mine:
        return False
    light = np.argsort(state.load, kind="stable")[:8]
    for a in sorted(mine, key=lambda i: -float(placements[i].option.cost[0])):
        pa = placements[a]
        ca = float(pa.option.cost[0])
        for q in light.tolist():
            if q == slowest:
                continue
            for b in sorted(by_rank.get(q, set())):
                pb = placements[b]
                if pb.option.sharding_type != table_wise:
                    continue
                cb = float(pb.option.cost[0])
                if cb >= ca:
                    continue
                if state.load[slowest] - ca + cb >= limit or state.load[q] - cb + ca >= limit:
                    continue
                hbm_ok = (state.hbm[slowest] - pa.option.hbm[0] + pb.option.hbm[0]
                          <= state.hbm_cap[slowest]
                          and state.hbm[q] - pb.option.hbm[0] + pa.option.hbm[0]
                          <= state.hbm_cap[q])
                ddr_ok = (state.ddr[slowest] - pa.option.ddr[0] + pb.option.ddr[0]
                          <= state.ddr_cap[slowest]
                          and state.ddr[q] - pb.option.ddr[0] + pa.option.ddr[0]
                          <= state.ddr_cap[q])
                pins_ok = all(
                    not p.option.table.constraints.ranks
                    or r in p.option.table.constraints.ranks
                    for p, r in ((pa, q), (pb, slowest)))
                if not (hbm_ok and ddr_ok and pins_ok):
                    continue
                for i, rank in ((a, q), (b, slowest)):
                    index_remove(i)  # type: ignore[operator]
                    state.remove(placements[i])
                    placements[i] = Placement(placements[i].option,
                                              np.array([rank], dtype=np.int64))
                    state.add(placements[i])
                    index_add(i)  # type: ignore[operator]
                return True
    return False
