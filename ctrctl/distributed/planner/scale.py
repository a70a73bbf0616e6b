"""The greedy search on options as arrays: thousands of tables on thousands of ranks.

The same bound as :class:`~ctrctl.distributed.planner.proposers.GreedyProposer` (each
table, most expensive first, takes the option and ranks with the lowest bound on the final
slowest rank), on :class:`~ctrctl.distributed.planner.arrays.OptionArrays` and per-rank
arrays instead of per-option objects:

* a table's options are a row of arrays; an option whose *lower* bound (the average term
  and its own cost, before looking at any rank) cannot beat the best found so far is never
  placed, which rules out spreading a small table over thousands of ranks in O(1);
* placement is by host, then rank: table-wise and column-wise shards go to the least-loaded
  rank with room, found through each host's least load and most free memory (``H`` values,
  a host's ``L`` ranks after that); row-wise and table-row-wise blocks sit where their
  geometry puts them, data-parallel replicas everywhere;
* nothing is ``tables x ranks``: the state is three arrays of ranks and two of hosts.

Time grows with tables x options plus, per table, the hosts scanned (``W / L`` values in
one numpy pass); memory with tables x options plus ranks.

Example:
    >>> chosen, failure = ArrayGreedy(topology).propose(OptionArrays.build(tables, topo, 512))
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, overload

import numpy as np

from ctrctl.distributed.planner.arrays import _DP, _RW, _TWCW, _TWRW, OptionArrays
from ctrctl.distributed.planner.estimators import step_overhead
from ctrctl.distributed.planner.feasibility import check_tier, check_total
from ctrctl.distributed.planner.repair import ROUNDS
from ctrctl.distributed.planner.topology import Topology
from ctrctl.distributed.planner.types import Enumerator, Placement, ShardingOption, TableSpec

#: Tables x ranks up to which a second greedy pass (largest tables first) runs.
SECOND_ORDER_MAX = 20_000_000


class HostState:
    """Per-rank load and memory, with per-host summaries for the least-loaded search."""

    def __init__(self, topology: Topology):
        w, local = topology.world_size, topology.local_world_size
        self.world, self.local, self.hosts = w, local, w // local
        self.load = np.zeros(w)
        self.hbm = np.zeros(w)
        self.ddr = np.zeros(w)
        self.hbm_cap = float(topology.hbm_available)
        self.ddr_cap = float(topology.ddr_available)
        self.host_min = np.zeros(self.hosts)  # least load on each host
        self.host_hbm = np.full(self.hosts, self.hbm_cap)  # most free hbm on each host
        self.host_ddr = np.full(self.hosts, self.ddr_cap)
        self.total = 0.0

    def refresh(self, hosts: np.ndarray | None = None) -> None:
        """Recompute the summaries of ``hosts`` (all when None)."""
        load = self.load.reshape(self.hosts, self.local)
        hbm = self.hbm.reshape(self.hosts, self.local)
        ddr = self.ddr.reshape(self.hosts, self.local)
        if hosts is None:
            self.host_min = load.min(axis=1)
            self.host_hbm = self.hbm_cap - hbm.min(axis=1)
            self.host_ddr = self.ddr_cap - ddr.min(axis=1)
            return
        self.host_min[hosts] = load[hosts].min(axis=1)
        self.host_hbm[hosts] = self.hbm_cap - hbm[hosts].min(axis=1)
        self.host_ddr[hosts] = self.ddr_cap - ddr[hosts].min(axis=1)

    def least_loaded(self, hbm: float, ddr: float, hosts: np.ndarray | None = None
                     ) -> int | None:
        """The least-loaded rank with room for a shard (on ``hosts`` only if given)."""
        room = (self.host_hbm >= hbm) & (self.host_ddr >= ddr)
        if hosts is not None:
            keep = np.zeros(self.hosts, dtype=bool)
            keep[hosts] = True
            room &= keep
        if not room.any():
            return None
        # The host with the least-loaded rank among those with room; its room may be on
        # another rank than its least load (then the ranks are scanned).
        host = int(np.argmin(np.where(room, self.host_min, np.inf)))
        span = slice(host * self.local, (host + 1) * self.local)
        fits = (self.hbm[span] + hbm <= self.hbm_cap) & (self.ddr[span] + ddr <= self.ddr_cap)
        best = host * self.local + int(np.argmin(np.where(fits, self.load[span], np.inf)))
        if fits.any() and self.load[best] <= self.host_min[host]:
            return best
        fits = (self.hbm + hbm <= self.hbm_cap) & (self.ddr + ddr <= self.ddr_cap)
        if hosts is not None:
            fits &= np.repeat(np.isin(np.arange(self.hosts), hosts), self.local)
        if not fits.any():
            return None
        return int(np.argmin(np.where(fits, self.load, np.inf)))

    def add(self, ranks: np.ndarray, cost: np.ndarray, hbm: np.ndarray, ddr: np.ndarray,
            sign: float = 1.0) -> None:
        """Add shards (``ranks`` may repeat); refresh the hosts touched."""
        if ranks.size == 1:  # most tables: one shard, plain scalar updates
            rank = int(ranks[0])
            self.load[rank] += sign * float(cost[0])
            self.hbm[rank] += sign * float(hbm[0])
            self.ddr[rank] += sign * float(ddr[0])
            host = rank // self.local
            span = slice(host * self.local, (host + 1) * self.local)
            self.host_min[host] = self.load[span].min()
            self.host_hbm[host] = self.hbm_cap - self.hbm[span].min()
            self.host_ddr[host] = self.ddr_cap - self.ddr[span].min()
            return
        if ranks.size == self.world and (ranks == np.arange(self.world)).all():
            self.load += sign * cost
            self.hbm += sign * hbm
            self.ddr += sign * ddr
            self.refresh()
            return
        np.add.at(self.load, ranks, sign * cost)
        np.add.at(self.hbm, ranks, sign * hbm)
        np.add.at(self.ddr, ranks, sign * ddr)
        self.refresh(np.unique(ranks // self.local))


class ArrayGreedy:
    """Greedy placement over :class:`OptionArrays` (see the module docstring).

    Args:
        topology: the ranks (no per-table pinned ranks: the array path has none).
        order: ``cost`` (most expensive table first) or ``memory`` (largest first).
    """

    def __init__(self, topology: Topology, order: str = "cost"):
        self.topology = topology
        self.order = order
        self.failure: tuple[int, HostState] | None = None
        #: after a proposal, its slowest rank plus the collectives' overhead
        self.score = np.inf

    def propose(self, arrays: OptionArrays, valid: np.ndarray | None = None
                ) -> list[tuple[int, np.ndarray]] | None:
        """Per table, (option column, ranks of its shards); None when some table found no
        room (``failure`` then holds the table and the state)."""
        topo = self.topology
        valid = arrays.valid if valid is None else valid
        total = np.where(valid, arrays.total, np.inf)
        cheapest = total.min(axis=1)
        cheapest = np.where(np.isfinite(cheapest), cheapest, 0.0)
        key = cheapest
        if self.order == "memory":
            key = np.where(valid, arrays.storage, np.inf).min(axis=1)
            key = np.where(np.isfinite(key), key, 0.0)
        order = np.lexsort((np.arange(len(cheapest)), -key))
        remaining = float(cheapest.sum())
        world = min(topo.world_size, topo.num_hosts * topo.parallel_ranks)
        pooled = float(sum(t.embedding_dim * t.element_bytes for t in arrays.tables)
                       ) * arrays.batch_size
        state = HostState(topo)
        types: Counter[str] = Counter()
        overheads: dict[str, float] = {}
        current_max = 0.0
        chosen: list[tuple[int, np.ndarray] | None] = [None] * len(cheapest)
        kinds = arrays.kinds
        per_table = bool(topo.sharding_overhead_per_table_s)
        for t in order.tolist():
            remaining -= float(cheapest[t])
            best: tuple[tuple[float, float, float], int, np.ndarray] | None = None
            fitting: set[tuple[str, int]] = set()
            columns = np.flatnonzero(valid[t])
            if per_table:  # measured per-table overheads change with every table
                overheads.clear()
            for j in columns[np.argsort(total[t, columns], kind="stable")].tolist():
                kind = kinds[j]
                if kind.shape in fitting:
                    continue  # a faster kernel of this shape already fits
                key = kind.sharding_type
                if key not in overheads:
                    overheads[key] = step_overhead(types + Counter({key: 1}), topo, pooled)
                overhead = overheads[key]
                c1 = float(arrays.c1[t, j])
                floor = max(current_max, c1, (state.total + float(total[t, j]) + remaining)
                            / world) + overhead
                if best is not None and (floor, float(total[t, j])) >= best[0][:2]:
                    continue
                found = self._place(state, arrays, t, j)
                if found is None:
                    continue
                fitting.add(kind.shape)
                ranks, touched = found
                bound = max(current_max, touched,
                            (state.total + float(total[t, j]) + remaining) / world) + overhead
                score = (bound, float(total[t, j]), touched)
                if best is None or score < best[0]:
                    best = (score, j, ranks)
            if best is None:
                self.failure = (t, state)
                return None
            _, j, ranks = best
            cost, hbm, ddr = self._shard_values(arrays, t, j, ranks.size)
            state.add(ranks, cost, hbm, ddr)
            state.total += float(total[t, j])
            current_max = max(current_max, float(state.load[ranks].max()))
            if types[kinds[j].sharding_type] == 0:
                overheads.clear()
            types[kinds[j].sharding_type] += 1
            chosen[t] = (j, ranks)
        self.failure = None
        self.score = float(state.load.max()) + step_overhead(types, topo, pooled)
        return [c for c in chosen if c is not None]

    @staticmethod
    def _shard_values(arrays: OptionArrays, t: int, j: int, k: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        values = []
        for first, last in ((arrays.c1, arrays.cl), (arrays.first["hbm"], arrays.last["hbm"]),
                            (arrays.first["ddr"], arrays.last["ddr"])):
            v = np.full(k, float(first[t, j]))
            v[-1] = float(last[t, j])
            values.append(v)
        return values[0], values[1], values[2]

    def _place(self, state: HostState, arrays: OptionArrays, t: int, j: int
               ) -> tuple[np.ndarray, float] | None:
        """Where option ``j`` of table ``t`` goes now and the highest load it leaves on the
        ranks it touches, or None without room."""
        kind = arrays.kinds[j].sharding_type
        k = int(arrays.shards[t, j])
        c1, cl = float(arrays.c1[t, j]), float(arrays.cl[t, j])
        h1, hl = float(arrays.first["hbm"][t, j]), float(arrays.last["hbm"][t, j])
        d1, dl = float(arrays.first["ddr"][t, j]), float(arrays.last["ddr"][t, j])
        if kind in (_DP, _RW):  # block i on rank i
            fits = (state.hbm[:k - 1] + h1 <= state.hbm_cap).all() and \
                (state.ddr[:k - 1] + d1 <= state.ddr_cap).all() and \
                state.hbm[k - 1] + hl <= state.hbm_cap and state.ddr[k - 1] + dl <= state.ddr_cap
            if not fits:
                return None
            touched = max(float(state.load[:k - 1].max(initial=0.0)) + c1,
                          float(state.load[k - 1]) + cl)
            return np.arange(k, dtype=np.int64), touched
        if kind == _TWRW:  # block i on local rank i of the host that ends least loaded
            local = state.local
            grid = (np.arange(state.hosts)[:, None] * local + np.arange(k)[None, :])
            h = np.full(k, h1)
            h[-1] = hl
            d = np.full(k, d1)
            d[-1] = dl
            c = np.full(k, c1)
            c[-1] = cl
            fits = ((state.hbm[grid] + h <= state.hbm_cap)
                    & (state.ddr[grid] + d <= state.ddr_cap)).all(axis=1)
            if not fits.any():
                return None
            host_touched = np.where(fits, (state.load[grid] + c).max(axis=1), np.inf)
            host = int(np.argmin(host_touched))
            return grid[host], float(host_touched[host])
        # table_wise, column_wise (any ranks), table_column_wise (one host): shard by shard
        # onto the least-loaded rank with room, then taken back.
        if k == 1:
            rank = state.least_loaded(h1, d1)
            if rank is None:
                return None
            return np.array([rank], dtype=np.int64), float(state.load[rank]) + c1
        if kind != _TWCW:
            found = _greedy_shards(state, k, c1, h1, d1, _near_ranks(state, k, h1, d1))
            if found is not None:
                return found
            # The hosts' room is a summary: settle it on the k least-loaded ranks with room.
            fits = np.flatnonzero((state.hbm + h1 <= state.hbm_cap)
                                  & (state.ddr + d1 <= state.ddr_cap))
            if fits.size > k:
                fits = fits[np.argpartition(state.load[fits], k - 1)[:k]]
            return _greedy_shards(state, k, c1, h1, d1, np.sort(fits))
        for host in np.argsort(state.host_min, kind="stable")[:4].tolist():
            found = _greedy_shards(state, k, c1, h1, d1,
                                   host * state.local + np.arange(state.local))
            if found is not None:
                return found
        return None



def _near_ranks(state: HostState, k: int, hbm: float, ddr: float) -> np.ndarray:
    """The ranks of the ``k`` hosts with the least-loaded ranks among those with room: they
    hold the ``k`` least-loaded ranks that have room, all a greedy placement of ``k`` alike
    shards can pick."""
    loads = np.where((state.host_hbm >= hbm) & (state.host_ddr >= ddr), state.host_min, np.inf)
    hosts = []
    for _ in range(min(k, state.hosts)):  # k is a few column blocks: k passes beat a sort
        host = int(np.argmin(loads))
        if not np.isfinite(loads[host]):
            break
        hosts.append(host)
        loads[host] = np.inf
    room = np.array(sorted(hosts), dtype=np.int64)
    return (room[:, None] * state.local + np.arange(state.local)[None, :]).ravel()


def _greedy_shards(state: HostState, k: int, cost: float, hbm: float, ddr: float,
                   candidates: np.ndarray) -> tuple[np.ndarray, float] | None:
    """``k`` alike shards one by one onto the least-loaded candidate with room (as
    :func:`~ctrctl.distributed.planner.partitioners.best_placement` does on all ranks)."""
    load = state.load[candidates].tolist()
    used_hbm = state.hbm[candidates].tolist()
    used_ddr = state.ddr[candidates].tolist()
    picks = []
    for _ in range(k):
        best = -1
        for i in range(len(load)):
            if used_hbm[i] + hbm <= state.hbm_cap and used_ddr[i] + ddr <= state.ddr_cap \
                    and (best < 0 or load[i] < load[best]
                         or (load[i] == load[best] and candidates[i] < candidates[best])):
                best = i
        if best < 0:
            return None
        picks.append(best)
        load[best] += cost
        used_hbm[best] += hbm
        used_ddr[best] += ddr
    return candidates[picks], max(load[i] for i in picks)

# ---- the whole plan on the array path ----------------------------------------------------
class LazyOptions(Sequence[list[ShardingOption]]):
    """Each table's option objects, enumerated the first time the local search asks."""

    def __init__(self, tables: list[TableSpec], enumerator: Enumerator):
        self.tables = tables
        self.enumerator = enumerator
        self.cache: dict[int, list[ShardingOption]] = {}

    def __len__(self) -> int:
        return len(self.tables)

    @overload
    def __getitem__(self, index: int) -> list[ShardingOption]: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[list[ShardingOption]]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index not in self.cache:
            self.cache[index] = self.enumerator.enumerate(self.tables[index])
        return self.cache[index]


def check_arrays(arrays: OptionArrays, topology: Topology) -> int | None:
    """The capacity proofs of ``feasibility.py`` on arrays: raises when the sums refuse;
    returns the first table none of whose options fits one rank (or None)."""
    fits = arrays.valid & (arrays.hbm1 <= topology.hbm_available) & (
        arrays.ddr1 <= topology.ddr_available)
    alone = np.flatnonzero(~fits.any(axis=1))
    if alone.size:
        return int(alone[0])
    n = len(arrays.tables)
    check_total(n, float(arrays.storage.min(axis=1).sum()), topology)
    for tier, values in (("hbm", arrays.hbm_total), ("ddr", arrays.ddr_total)):
        check_tier(n, tier, float(np.where(arrays.valid, values, np.inf).min(axis=1).sum()),
                   topology)
    return None


def leaner_masks(arrays: OptionArrays, tier: str) -> list[np.ndarray]:
    """The repair of ``repair.py`` on arrays: valid masks with ever more tables (those whose
    fastest option saves least per byte of ``tier``) restricted to their leanest options."""
    footprint = np.where(arrays.valid, arrays.hbm_total if tier == "hbm" else arrays.ddr_total,
                         np.inf)
    least = footprint.min(axis=1, keepdims=True)
    lean = arrays.valid & (footprint <= least * 1.01 + 1.0)
    rows = np.arange(len(arrays.tables))
    fastest = np.argmin(arrays.total, axis=1)
    lean_cost = np.where(lean, arrays.total, np.inf).min(axis=1)
    extra = footprint[rows, fastest] - least[:, 0]
    value = np.where(extra > 0, (lean_cost - arrays.total[rows, fastest]) / np.maximum(extra, 1),
                     np.inf)
    ranked = [int(i) for i in np.argsort(value, kind="stable") if np.isfinite(value[i])]
    masks, done = [], 0
    for share in ROUNDS:
        count = max(1, round(share * len(ranked)))
        if count <= done or not ranked:
            continue
        done = count
        mask = arrays.valid.copy()
        chosen = np.array(ranked[:count])
        mask[chosen] = lean[chosen]
        masks.append(mask)
    return masks


def plan_with_arrays(tables: list[TableSpec], topology: Topology, batch_size: int,
                     sharding_types: tuple[str, ...] | None, enumerator: Enumerator,
                     local_search: bool, max_evaluations: int | None = None
                     ) -> list[Placement]:
    """Placements for every table through the array path (capacity proofs, greedy search,
    repair, and a bounded local search on the slowest ranks).

    Raises:
        PlanError: what cannot fit, with the same messages as the object path.
    """
    from ctrctl.distributed.planner.partitioners import RankState
    from ctrctl.distributed.planner.planner import no_fit_error
    from ctrctl.distributed.planner.proposers import Failure, improve

    arrays = OptionArrays.build(tables, topology, batch_size, sharding_types)
    greedy = ArrayGreedy(topology)
    alone = check_arrays(arrays, topology)
    chosen = None if alone is not None else greedy.propose(arrays)
    if chosen is not None and len(tables) * topology.world_size <= SECOND_ORDER_MAX:
        # The largest tables first as well (a second pass): keep the faster plan.
        by_memory = ArrayGreedy(topology, order="memory")
        other = by_memory.propose(arrays)
        if other is not None and by_memory.score < greedy.score:
            chosen = other
    if chosen is None and alone is None and greedy.failure is not None:
        tier = _full_tier(greedy.failure[1])
        for mask in leaner_masks(arrays, tier):
            chosen = greedy.propose(arrays, mask)
            if chosen is not None:
                break
    if chosen is None:
        index = alone if alone is not None else greedy.failure[0]  # type: ignore[index]
        state = RankState(topology)
        if alone is None and greedy.failure is not None:
            host = greedy.failure[1]
            state.load, state.hbm, state.ddr = host.load, host.hbm, host.ddr
        least = arrays.storage.min(axis=1)
        total = float(least[np.isfinite(least)].sum())
        raise no_fit_error([tables[index]], [enumerator.enumerate(tables[index])], topology,
                           Failure(0, state), total_need=total)
    placements = [Placement(arrays.option(t, j), ranks)
                  for t, (j, ranks) in enumerate(chosen)]
    if local_search:
        # Each evaluation is a pass over the ranks: a budget of about 8M rank-updates.
        if max_evaluations is None:
            max_evaluations = int(np.clip(8_000_000 // topology.world_size, 200, 2_000))
        pooled = float(sum(t.embedding_dim * t.element_bytes for t in tables)) * batch_size
        placements = improve(placements, LazyOptions(tables, enumerator),  # type: ignore[arg-type]
                             topology, max_evaluations=max_evaluations, pooled=pooled)
    return placements


def _full_tier(state: HostState) -> str:
    shares = {"hbm": float(state.hbm.max()) / state.hbm_cap if state.hbm_cap > 0 else -1.0,
              "ddr": float(state.ddr.max()) / state.ddr_cap if state.ddr_cap > 0 else -1.0}
    return max(shares, key=lambda t: shares[t])
