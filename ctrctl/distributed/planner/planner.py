"""The planner: tables + topology -> the :class:`ShardingPlan` with the fastest slowest rank.

``plan()`` is pure: it needs no process group, no device and no model, only table shapes.
Pipeline: enumerate options per table -> price them (storage + cost) -> greedy proposals in
two orders (by cost, by size) -> local search on the slowest rank -> keep the plan whose
slowest rank (plus the collectives' fixed latency) is fastest. Before the search, sums of
each table's smallest option refuse what cannot fit (``feasibility.py``); after a failed
search, replicated tables are sharded where they buy least per byte (``repair.py``), and a
bounded exhaustive search is the last resort (``exhaustive.py``). When nothing fits, a
:class:`PlanError` says which table does not fit where, by how much, and what would help.

Example:
    >>> tables = [TableSpec(f"C{i}", n, 128) for i, n in enumerate(CRITEO_1TB_ROWS)]
    >>> result = EmbeddingShardingPlanner(Topology.preset("h100", 64), batch_size=512
    ...                                   ).plan(tables)
    >>> result.plan.save("plan.json"); result.step_time
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ctrctl.distributed.planner.arrays import supports
from ctrctl.distributed.planner.enumerators import EmbeddingEnumerator
from ctrctl.distributed.planner.estimators import (
    EmbeddingPerfEstimator,
    price,
    slowest_rank_time,
    step_overhead,
)
from ctrctl.distributed.planner.exhaustive import DEFAULT_BUDGET, ExhaustiveProposer
from ctrctl.distributed.planner.feasibility import (
    capacity_hints,
    check_capacity,
    smallest_storage,
)
from ctrctl.distributed.planner.partitioners import RankState
from ctrctl.distributed.planner.proposers import (
    Failure,
    FastestOptionProposer,
    GreedyProposer,
    improve,
)
from ctrctl.distributed.planner.repair import full_tier, leaner_options
from ctrctl.distributed.planner.scale import plan_with_arrays
from ctrctl.distributed.planner.topology import GIB, Topology
from ctrctl.distributed.planner.types import (
    Enumerator,
    Estimator,
    Placement,
    Proposer,
    ShardingOption,
    TableSpec,
)
from ctrctl.distributed.types import ParameterSharding, ShardingPlan, ShardMetadata
from ctrctl.errors import PlanError
from ctrctl.names import ComputeKernel

logger = logging.getLogger(__name__)

PLANNER_VERSION = "ctrctl-planner-1"
#: Above this many tables the exhaustive last resort is skipped (its depth is the tables).
_EXHAUSTIVE_TABLES = 64
#: Tables x ranks from which the array path plans (when it can).
ARRAY_PATH_MIN = 1_000_000
#: ... or from this many tables, whatever the ranks.
ARRAY_PATH_TABLES = 500
_COST_KEYS = ("fwd_compute", "bwd_compute", "fwd_comms", "bwd_comms")


@dataclass
class PlanResult:
    """A plan with the estimates behind it.

    Attributes:
        plan: the plan (what ``plan.json`` holds).
        placements: per table, the chosen option and the rank of each shard.
        topology, batch_size: what it was planned for (batch per rank).
        rank_cost: per rank, seconds per step by part (``fwd_compute`` ...), ``(W, 4)``.
        rank_hbm, rank_ddr: per rank, bytes used.
        overhead: the collectives' fixed latency per step (the same on every rank).
        planning_seconds: time the search took.
    """

    plan: ShardingPlan
    placements: list[Placement]
    topology: Topology
    batch_size: int
    rank_cost: np.ndarray
    rank_hbm: np.ndarray
    rank_ddr: np.ndarray
    overhead: float
    planning_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def rank_total(self) -> np.ndarray:
        return self.rank_cost.sum(axis=1)

    @property
    def step_time(self) -> float:
        """Estimated seconds per step of the embedding part: the slowest rank (or host, where
        ranks share cores) plus the fixed overhead."""
        if not self.rank_total.size:
            return 0.0
        return slowest_rank_time(self.rank_cost, self.topology) + self.overhead

    @property
    def imbalance(self) -> float:
        """Slowest rank over the mean rank (1.0 is perfect balance)."""
        total = self.rank_total
        mean = float(total.mean()) if total.size else 0.0
        return float(total.max()) / mean if mean > 0 else 1.0


def _rank_arrays(placements: list[Placement], world: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    cost = np.zeros((world, len(_COST_KEYS)))
    hbm, ddr = np.zeros(world), np.zeros(world)
    for p in placements:
        for j, key in enumerate(_COST_KEYS):
            np.add.at(cost[:, j], p.ranks, getattr(p.option, key))
        np.add.at(hbm, p.ranks, p.option.hbm)
        np.add.at(ddr, p.ranks, p.option.ddr)
    return cost, hbm, ddr


def _score(placements: list[Placement], topology: Topology) -> float:
    if topology.parallel_ranks >= topology.local_world_size:
        state = RankState(topology)
        for p in placements:
            state.add(p)
        slowest = float(state.load.max())
    else:
        slowest = slowest_rank_time(_rank_arrays(placements, topology.world_size)[0], topology)
    types = [p.option.sharding_type for p in placements]
    return slowest + step_overhead(types, topology, sum(p.option.pooled_bytes
                                                        for p in placements))


def build_result(placements: list[Placement], topology: Topology, batch_size: int,
                 seconds: float = 0.0) -> PlanResult:
    """Turn placements into a :class:`PlanResult` with its :class:`ShardingPlan`."""
    world = topology.world_size
    cost, hbm, ddr = _rank_arrays(placements, world)
    overhead = step_overhead([p.option.sharding_type for p in placements], topology,
                             sum(p.option.pooled_bytes for p in placements))
    tables: dict[str, ParameterSharding] = {}
    for p in placements:
        o = p.option
        shards = tuple(
            ShardMetadata(rank=int(r), row_offset=int(ro), col_offset=int(co), rows=int(nr),
                          cols=int(nc))
            for r, ro, co, nr, nc in zip(p.ranks, o.row_offsets, o.col_offsets, o.rows, o.cols,
                                         strict=True))
        tables[o.table.name] = ParameterSharding(
            sharding_type=o.sharding_type, compute_kernel=o.compute_kernel,
            num_embeddings=o.table.num_embeddings, embedding_dim=o.table.embedding_dim,
            shards=shards, storage_bytes=int(o.storage_bytes),
            cost={key: float(getattr(o, key).sum()) for key in _COST_KEYS},
            cache_load_factor=o.cache_load_factor)
    ranks = []
    for r in range(world):
        ranks.append({
            "rank": r,
            "hbm_bytes": int(hbm[r]), "ddr_bytes": int(ddr[r]),
            "hbm_capacity": int(topology.hbm_available),
            "ddr_capacity": int(topology.ddr_available),
            **{key: float(cost[r, j]) for j, key in enumerate(_COST_KEYS)},
            "total": float(cost[r].sum()),
        })
    total = cost.sum(axis=1)
    result_meta = {
        "planner": PLANNER_VERSION,
        "batch_size_per_rank": batch_size,
        "estimated_step_seconds": slowest_rank_time(cost, topology) + overhead if world
        else 0.0,
        "collective_overhead_seconds": overhead,
        "imbalance": float(total.max() / total.mean()) if total.mean() > 0 else 1.0,
        "planning_seconds": seconds,
    }
    plan = ShardingPlan(world_size=world, local_world_size=topology.local_world_size,
                        tables=tables, topology=topology.to_dict(), ranks=ranks,
                        metadata=result_meta)
    return PlanResult(plan=plan, placements=placements, topology=topology,
                      batch_size=batch_size, rank_cost=cost, rank_hbm=hbm, rank_ddr=ddr,
                      overhead=overhead, planning_seconds=seconds)


class EmbeddingShardingPlanner:
    """Plans tables onto a topology from the cost model.

    The roles are arguments, as in TorchRec's planner, each with today's default: the
    enumerator lists every allowed option of a table and has the estimator price them, each
    proposer chooses an option and ranks for every table (see
    :class:`~ctrctl.distributed.planner.types.Proposer`), the local search improves each
    proposal, and the plan whose slowest rank is fastest wins.

    Args:
        topology: the ranks, their memory and bandwidths.
        batch_size: samples per rank per step.
        sharding_types: types allowed for every table (None: all); per-table constraints
            live on each :class:`TableSpec`.
        local_search: run the local search after each proposal (on by default).
        enumerator: lists and prices options (default: :class:`EmbeddingEnumerator` over
            ``estimator``).
        estimator: prices options for the default enumerator (default:
            :class:`EmbeddingPerfEstimator`, the calibrated or TorchRec cost model).
        proposers: searches to run (default: greedy by cost, greedy by memory, and TorchRec's
            fastest-option proposal).
        exhaustive_budget: placements the exhaustive last resort may try when every
            proposal (and the repair with fewer replicas) runs out of memory, for sets of
            up to 64 tables (0: no last resort).
        array_path: plan with options as arrays (``arrays.py``, ``scale.py``): True, False,
            or None for tables x ranks of at least a million (or 500 tables) with the
            default roles and no per-table constraints.

    Example:
        >>> planner = EmbeddingShardingPlanner(Topology.preset("cpu", 2), batch_size=4096)
        >>> result = planner.plan([TableSpec("C1", 100_000, 64)])
        >>> EmbeddingShardingPlanner(topology, proposers=[MyProposer()]).plan(tables)
    """

    def __init__(self, topology: Topology, batch_size: int = 512,
                 sharding_types: tuple[str, ...] | None = None, local_search: bool = True,
                 enumerator: Enumerator | None = None, estimator: Estimator | None = None,
                 proposers: Sequence[Proposer] | None = None,
                 exhaustive_budget: int = DEFAULT_BUDGET, array_path: bool | None = None):
        if batch_size <= 0:
            raise PlanError(f"batch size {batch_size} must be positive")
        self.topology = topology
        self.batch_size = batch_size
        self.sharding_types = sharding_types
        self.local_search = local_search
        self.exhaustive_budget = exhaustive_budget
        # The array path enumerates, prices and searches as the default roles do.
        self._default_roles = enumerator is None and estimator is None and proposers is None
        self.array_path = array_path
        self.estimator = estimator or EmbeddingPerfEstimator(topology, batch_size)
        self.enumerator = enumerator or EmbeddingEnumerator(topology, batch_size, sharding_types,
                                                            self.estimator)
        self.proposers: list[Proposer] = list(proposers) if proposers is not None else [
            GreedyProposer(topology, order="cost"),
            GreedyProposer(topology, order="memory"),
            FastestOptionProposer(topology)]
        if not self.proposers:
            raise PlanError("the planner needs at least one proposer")

    def _use_arrays(self, tables: list[TableSpec]) -> bool:
        possible = self._default_roles and supports(tables, self.sharding_types)
        if self.array_path is not None:
            return self.array_path and possible
        return possible and (len(tables) * self.topology.world_size >= ARRAY_PATH_MIN
                             or len(tables) >= ARRAY_PATH_TABLES)

    def enumerate(self, tables: list[TableSpec]) -> list[list[ShardingOption]]:
        return [self.enumerator.enumerate(t) for t in tables]

    def _search(self, options: list[list[ShardingOption]],
                proposers: Sequence[Proposer] | None = None
                ) -> tuple[list[Placement] | None, float, Failure | None]:
        """Every proposer, each proposal improved; the best placements, their score, and
        the first failure (None when a proposer found a plan)."""
        best: list[Placement] | None = None
        best_score = math.inf
        failure: Failure | None = None
        for proposer in proposers if proposers is not None else self.proposers:
            placements = proposer.propose(options)
            if placements is None:
                failure = failure or getattr(proposer, "failure", None)
                continue
            if self.local_search:
                placements = improve(placements, options, self.topology)
            score = _score(placements, self.topology)
            logger.debug("proposal by %s: slowest rank %.6g s", type(proposer).__name__, score)
            if score < best_score:
                best, best_score = placements, score
        return best, best_score, None if best is not None else failure

    def plan(self, tables: list[TableSpec]) -> PlanResult:
        """The best plan found for ``tables``.

        Raises:
            PlanError: when no table set placement fits, saying why and what would help.
        """
        if not tables:
            raise PlanError("no tables to plan", hint="the dataset has no sparse features?")
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise PlanError(f"duplicate table names: {', '.join(dup)}")
        start = time.perf_counter()
        if self._use_arrays(tables):
            placements = plan_with_arrays(tables, self.topology, self.batch_size,
                                          self.sharding_types, self.enumerator,
                                          self.local_search)
            seconds = time.perf_counter() - start
            logger.info("planned %d tables on %d ranks in %.2f s (array path)", len(tables),
                        self.topology.world_size, seconds)
            return build_result(placements, self.topology, self.batch_size, seconds)
        options = self.enumerate(tables)
        for table, opts in zip(tables, options, strict=True):
            if not opts:
                raise PlanError("no sharding option is allowed", where=f"table {table.name!r}",
                                hint="its constraints exclude every sharding type or kernel "
                                     f"on a {self.topology.device} topology of "
                                     f"{self.topology.world_size} ranks")
        check_capacity(tables, options, self.topology)
        best, best_score, failure = self._search(options)
        if best is None and failure is not None:
            # Fast options (replicas, device-memory kernels) may have crowded the rest out:
            # restrict the tables they buy least for per byte to their leanest options.
            tier = full_tier(failure.state)
            for restricted in leaner_options(options, self.topology, tier):
                best, best_score, _ = self._search(restricted)
                if best is not None:
                    logger.info("%s ran out: planned with leaner options", tier)
                    break
        if best is None and self.exhaustive_budget and len(tables) <= _EXHAUSTIVE_TABLES:
            exhaustive = ExhaustiveProposer(self.topology, self.exhaustive_budget)
            best, best_score, _ = self._search(options, [exhaustive])
        if best is None:
            if failure is None:
                raise PlanError("no proposer found a plan",
                                hint="the proposers given returned no placement")
            raise no_fit_error(tables, options, self.topology, failure)
        seconds = time.perf_counter() - start
        logger.info("planned %d tables on %d ranks in %.2f s: estimated %.3g s per step",
                    len(tables), self.topology.world_size, seconds, best_score)
        return build_result(best, self.topology, self.batch_size, seconds)


def plan_tables(tables: list[TableSpec], topology: Topology, batch_size: int = 512,
                sharding_types: tuple[str, ...] | None = None) -> PlanResult:
    """Shorthand for ``EmbeddingShardingPlanner(...).plan(tables)``."""
    return EmbeddingShardingPlanner(topology, batch_size, sharding_types).plan(tables)


# ---- rating any plan (hand-written, or another planner's) ---------------------------------
def rate_plan(plan: ShardingPlan, tables: list[TableSpec], topology: Topology,
              batch_size: int) -> PlanResult:
    """Price an existing plan with this cost model (same numbers as the planner's own).

    Args:
        plan: any valid plan for ``tables``.
        tables: the tables (pooling factors, optimizer, data type).
        topology: the ranks (its world size must match the plan's).
        batch_size: samples per rank per step.
    """
    by_name = {t.name: t for t in tables}
    plan.validate({t.name: (t.num_embeddings, t.embedding_dim) for t in tables},
                  world_size=topology.world_size)
    placements = []
    for name, ps in plan.tables.items():
        shards = ps.shards
        arr = {k: np.array([getattr(s, k) for s in shards], dtype=np.int64)
               for k in ("rank", "rows", "cols", "row_offset", "col_offset")}
        option = ShardingOption(
            table=by_name[name], sharding_type=ps.sharding_type,
            compute_kernel=ps.compute_kernel, rows=arr["rows"], cols=arr["cols"],
            row_offsets=arr["row_offset"], col_offsets=arr["col_offset"],
            fixed_ranks=arr["rank"], cache_load_factor=ps.cache_load_factor)
        placements.append(Placement(price(option, topology, batch_size), arr["rank"]))
    return build_result(placements, topology, batch_size)


# ---- when nothing fits --------------------------------------------------------------------
def _gib(value: float) -> str:
    return f"{value / GIB:.2f} GiB"


def no_fit_error(tables: list[TableSpec], options: list[list[ShardingOption]],
                 topology: Topology, failure: Failure, total_need: float | None = None
                 ) -> PlanError:
    """A :class:`PlanError` naming the table that found no room and what would make it fit.

    Args:
        total_need: every table's smallest bytes together (default: from ``options``, which
            then holds every table's options).
    """
    table = tables[failure.table_index]
    opts = [o.ensure_priced() for o in options[failure.table_index]]
    for t_opts in options:
        for o in t_opts:
            o.ensure_priced()
    state = failure.state
    free_tier = {"hbm": float((state.hbm_cap - state.hbm).max()),
                 "ddr": float((state.ddr_cap - state.ddr).max())}

    def shortfall(o: ShardingOption) -> tuple[float, str]:
        """How far the option's largest shard is from fitting the freest rank, and where."""
        gaps = {t: float(getattr(o, t).max()) - free_tier[t] for t in ("hbm", "ddr")}
        tier = max(gaps, key=lambda t: gaps[t])
        return gaps[tier], tier

    smallest = min(range(len(opts)), key=lambda i: shortfall(opts[i])[0])
    gap, tier = shortfall(opts[smallest])
    need = float(getattr(opts[smallest], tier).max())
    free = free_tier[tier]
    world = topology.world_size
    capacity = topology.ddr_available if tier == "ddr" else topology.hbm_available
    # Across tiers: a table can move between device and host memory with the kernel.
    if total_need is None:
        total_need = sum(smallest_storage(t_opts) for t_opts in options)
    hints = []
    if gap > 0:
        hints.append(f"{_gib(gap)} more {tier} on a rank would hold it")
    hints += capacity_hints(total_need, topology)
    if topology.device == "cuda":
        caching = [o for o in opts if o.compute_kernel == ComputeKernel.FUSED_UVM_CACHING.value]
        if not caching:
            hints.append(f"allow {ComputeKernel.FUSED_UVM_CACHING.value} for {table.name!r} to "
                         "keep most of its rows in host memory")
        else:
            option = min(caching, key=lambda o: float(o.hbm.max()))
            weights = float(option.ddr.max())
            io = float(option.hbm.max()) - (option.cache_load_factor or 0) * weights
            free_hbm = free_tier["hbm"]
            if tier == "hbm" and weights > 0 and free_hbm > io:
                hints.append(f"a cache_load_factor of at most {(free_hbm - io) / weights:.3f} "
                             f"for {table.name!r}")
    size = table.weight_bytes + table.state_bytes(table.num_embeddings, table.embedding_dim)
    message = (f"no plan fits: table {table.name!r} ({table.num_embeddings:,} x "
               f"{table.embedding_dim}, {_gib(size)} with optimizer state) does not fit; its "
               f"closest option ({opts[smallest].label}) needs {_gib(need)} of {tier}, the "
               f"most free rank has {_gib(free)} of {_gib(capacity)} left")
    return PlanError(message, where=f"world size {world}", hint="; ".join(hints))
