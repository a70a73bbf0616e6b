"""ShardedEmbeddingBagCollection and its sharder: an EmbeddingBagCollection cut by a plan.

The sharded collection takes the same input as the unsharded one (a KeyedJaggedTensor of this
rank's local batch) and returns the same output (a KeyedTensor of pooled embeddings for those
samples, features in the collection's order). Inside, tables are grouped by sharding type and
each group runs its input distribution, lookup and output distribution
(:mod:`ctrctl.distributed.sharding`).

Gradient division: each rank's loss is a mean over its local batch and DDP averages dense
gradients over ranks, so dense parameters step on the gradient of the mean over the *global*
batch. Embedding gradients flow back through the output collectives, which sum over source
ranks; with ``gradient_division`` (the default, as TorchRec) they are scaled by 1/world size so
that embeddings also see the global-mean gradient, and a sharded model trains exactly as the
unsharded one on the concatenated batch.

Example:
    >>> sharder = EmbeddingBagCollectionSharder()
    >>> sharded = sharder.shard(ebc, plan)          # on every rank, same plan
    >>> pooled = sharded(kjt)                       # KeyedTensor, (B_local, sum of dims)
    >>> dist_input = sharded.input_dist(kjt)        # the same by stages (a train pipeline)
    >>> dist_input.launch()
    >>> pooled = sharded.compute_and_output_dist(dist_input)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from ctrctl.distributed.sharding.base import EmbeddingSharding, LocalShard, PendingInput
from ctrctl.distributed.sharding.cw import CwSharding
from ctrctl.distributed.sharding.dp import DpSharding
from ctrctl.distributed.sharding.routed import RoutedSharding
from ctrctl.distributed.sharding.rw import RwSharding
from ctrctl.distributed.sharding.tw import TwSharding
from ctrctl.distributed.sharding.twcw import TwcwSharding
from ctrctl.distributed.sharding.twrw import TwrwSharding
from ctrctl.distributed.sharding.variable_batch import (
    DedupInput,
    PendingDedupExchange,
    dedup_lookup,
    dedup_output_dist,
    start_dedup_input_dist,
)
from ctrctl.distributed.types import ParameterSharding, ShardingPlan
from ctrctl.errors import PlanError, SparseInputError
from ctrctl.modules.batched_embedding import BatchedEmbeddingBag
from ctrctl.modules.cached_embedding import CachedEmbeddingBag, CachedTableSpec, table_seed
from ctrctl.modules.embedding_configs import EmbeddingBagConfig
from ctrctl.modules.embedding_modules import EmbeddingBagCollection
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
from ctrctl.names import ComputeKernel, ShardingType
from ctrctl.sparse.dedup import deduplicate, distinct_share, restore
from ctrctl.sparse.jagged_tensor import KeyedJaggedTensor
from ctrctl.sparse.keyed_tensor import KeyedTensor
from ctrctl.sparse.ops import permute_2d_sparse

#: ``dedup: auto`` deduplicates a batch whose distinct bags are fewer than this share of its
#: bags. Measured by ``scripts/bench_dedup.py`` (2 gloo ranks, the embedding stage): dedup
#: ran 1.24x faster at a share of 0.28 (Zipf 1.2) and 1.48x at 0.20, but 0.76x at 0.43
#: (Zipf 1.05) and 1.04-1.10x at 0.50: every case at or below 0.28 gained, one at 0.43 lost;
#: 0.35 lies between.
DEDUP_AUTO_THRESHOLD = 0.35

#: Sharding type -> the class that implements it (order: the order groups run in).
SHARDING_CLASSES: dict[str, type[EmbeddingSharding]] = {
    ShardingType.DATA_PARALLEL.value: DpSharding,
    ShardingType.TABLE_WISE.value: TwSharding,
    ShardingType.COLUMN_WISE.value: CwSharding,
    ShardingType.TABLE_COLUMN_WISE.value: TwcwSharding,
    ShardingType.ROW_WISE.value: RwSharding,
    ShardingType.TABLE_ROW_WISE.value: TwrwSharding,
}


@dataclass
class EBCInputDist:
    """A batch's input distribution in flight, one entry per sharding group (in run order).

    Attributes:
        pending: each group's started stage 1.
        lengths: each group's (F_g, B_local) input lengths (output dist needs them).
        deduplicated: per group, whether it got the deduplicated batch (then its
            ``pending`` is a :class:`PendingDedupExchange`); empty: none did.
    """

    pending: list[PendingInput[Any]]
    lengths: list[torch.Tensor]
    deduplicated: list[bool] = dataclasses.field(default_factory=list)

    def launch(self) -> None:
        """Put every group's data exchange in flight (after the split sizes arrive)."""
        for p in self.pending:
            p.launch()


class ShardedEmbeddingBagCollection(nn.Module):
    """An EmbeddingBagCollection whose tables are sharded across the ranks of ``group``.

    Args:
        tables: the collection's tables, in its order.
        plan: table name -> :class:`ParameterSharding` (a :class:`ShardingPlan`'s ``tables``).
        optimizer: the optimizer fused into the lookups' backward.
        group: the process group (default: the world); every rank builds the same module.
        gradient_division: scale embedding gradients by 1/world size (see the module docstring).
        backend: the lookup kernels: ``auto``, ``fbgemm``, ``native`` or ``torch``.
        local_world_size: ranks per host (table_row_wise reduces within a host first);
            default: the whole group is one host.
        cached: table name -> how it is cached: its shards live on disk with a DRAM row
            cache (the ``fused_cached`` kernel), each starting as its block of the whole
            table would (any type but data_parallel).
        dedup: ``off``; ``on``: each batch's repeated bags are looked up and sent once
            (every type but data_parallel; :mod:`ctrctl.sparse.dedup`); ``auto``: on for a
            batch whose distinct-bag share is below ``dedup_threshold``.
        dedup_threshold: the share below which ``auto`` deduplicates a batch.

    Example:
        >>> sebc = ShardedEmbeddingBagCollection(tables, plan.tables,
        ...                                      EmbeddingOptimizerConfig(lr=0.05))
        >>> sebc.load_table_weights({"t0": full_weight})
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        plan: Mapping[str, ParameterSharding],
        optimizer: EmbeddingOptimizerConfig,
        group: Any | None = None,
        gradient_division: bool = True,
        backend: str = "auto",
        local_world_size: int | None = None,
        cached: Mapping[str, CachedTableSpec] | None = None,
        dedup: str = "off",
        dedup_threshold: float = DEDUP_AUTO_THRESHOLD,
    ) -> None:
        super().__init__()
        self.set_dedup(dedup, dedup_threshold)
        #: distinct bags over all bags of the last batch deduplicated or considered (auto/on)
        self.last_distinct_share: float | None = None
        self.tables = list(tables)
        self.group = group
        world = dist.get_world_size(group)
        missing = [t.name for t in self.tables if t.name not in plan]
        if missing:
            raise PlanError(f"tables missing from the plan: {', '.join(missing)}",
                            hint="plan again for this model")
        self.feature_names = [f for t in self.tables for f in t.feature_names]
        self.feature_dims = [t.embedding_dim for t in self.tables for _ in t.feature_names]
        grad_scale = 1.0 / world if gradient_division else 1.0
        self.groups = nn.ModuleDict()
        for kind, cls in SHARDING_CLASSES.items():
            chosen = [t for t in self.tables if plan[t.name].sharding_type == kind]
            if not chosen:
                continue
            extra = {"local_world_size": local_world_size} if cls is TwrwSharding else {}
            group_cached = {t.name: (cached or {})[t.name] for t in chosen
                            if t.name in (cached or {})}
            self.groups[kind] = cls(chosen, [plan[t.name] for t in chosen], optimizer,
                                    group, grad_scale, backend, cached=group_cached, **extra)
        unknown = {plan[t.name].sharding_type for t in self.tables} - set(SHARDING_CLASSES)
        if unknown:
            raise PlanError(f"unknown sharding type(s) {sorted(unknown)}",
                            hint=f"use one of {list(SHARDING_CLASSES)}")
        group_features = [f for g in self.sharding_groups() for f in g.feature_names]
        position = {f: i for i, f in enumerate(group_features)}
        group_dims = [d for g in self.sharding_groups() for d in g.feature_dims]
        starts = [0]
        for d in group_dims:
            starts.append(starts[-1] + d)
        order = torch.cat([torch.arange(starts[position[f]], starts[position[f] + 1])
                           for f in self.feature_names])
        identity = bool(torch.equal(order, torch.arange(order.numel())))
        self.register_buffer("column_order", None if identity else order, persistent=False)

    def set_dedup(self, mode: str, threshold: float = DEDUP_AUTO_THRESHOLD) -> None:
        """Switch deduplicated lookups ``on``, ``off`` or ``auto`` (below ``threshold``)."""
        if mode not in ("auto", "on", "off"):
            raise PlanError(f"unknown dedup mode {mode!r}", where="ShardedEmbeddingBagCollection",
                            hint="use auto, on or off")
        self.dedup, self.dedup_threshold = mode, threshold

    def sharding_groups(self) -> list[EmbeddingSharding]:
        """One group per sharding type present, in the order they run."""
        return [cast(EmbeddingSharding, g) for g in self.groups.values()]

    # ---- forward, by stages ------------------------------------------------------------------
    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Pooled embeddings of this rank's samples: (B_local, sum of the features' dims)."""
        return self.compute_and_output_dist(self.input_dist(features))

    def input_dist(self, features: KeyedJaggedTensor) -> EBCInputDist:
        """Stage 1 of every group, started: permute each group's features out of the batch,
        route them and put their exchanges in flight (split sizes first).

        The result's :meth:`EBCInputDist.launch` sends the ids once the sizes are known;
        :meth:`compute_and_output_dist` waits for them. A train pipeline calls this for batch
        i+1 before batch i's forward, ``launch`` after it, so the ids travel while batch i
        runs backward. Every rank must start its input dists in the same order.
        """
        keys = features.keys()
        index = {k: i for i, k in enumerate(keys)}
        absent = [f for f in self.feature_names if f not in index]
        if absent:
            raise SparseInputError(f"features {absent} are not in the batch",
                                   where="ShardedEmbeddingBagCollection",
                                   hint=f"the batch has {keys}")
        deduped = self._deduplicated(features)
        if features.variable_stride_per_key():
            features = restore(features)        # the plain batch, for groups that want it
        batch = features.stride()
        lengths = features.lengths().view(len(keys), batch)
        values, weights = features.values(), features.weights_or_none()
        pending: list[PendingInput[Any]] = []
        group_lengths, flags = [], []
        for group in self.sharding_groups():
            if deduped is not None and group.supports_dedup:
                routed = cast(RoutedSharding, group)
                local = DedupInput.from_kjt(deduped, group.feature_names)
                pending.append(start_dedup_input_dist(routed, local))
                group_lengths.append(lengths.new_zeros(0))
                flags.append(True)
                continue
            flags.append(False)
            wanted = [index[f] for f in group.feature_names]
            if wanted == list(range(len(keys))):
                g_len, g_val, g_wt = lengths, values, weights
            else:
                perm = torch.tensor(wanted, dtype=torch.long)
                g_len, g_val, g_wt = permute_2d_sparse(perm, lengths, values, weights)
            pending.append(group.start_input_dist(g_len, g_val, g_wt))
            group_lengths.append(g_len)
        return EBCInputDist(pending, group_lengths, flags)

    def _deduplicated(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor | None:
        """The batch deduplicated when this batch should be (a batch that already is: as
        given), else None."""
        if features.variable_stride_per_key():
            if features.inverse_indices_or_none() is None:
                raise SparseInputError("a variable batch per key without inverse_indices",
                                       where="ShardedEmbeddingBagCollection",
                                       hint="build it with ctrctl.sparse.dedup.deduplicate")
            self.last_distinct_share = distinct_share(features)
            return features
        if self.dedup == "off" or not any(g.supports_dedup for g in self.sharding_groups()):
            return None
        deduped = deduplicate(features)
        self.last_distinct_share = distinct_share(deduped)
        if self.dedup == "auto" and self.last_distinct_share >= self.dedup_threshold:
            return None                    # too few repeats to pay for it: the plain path
        return deduped

    def compute_and_output_dist(self, dist_input: EBCInputDist) -> KeyedTensor:
        """Stages 2 and 3 of every group: wait for the ids, pool the shards held here, send
        the pooled embeddings back -> (B_local, sum of the features' dims) as a KeyedTensor."""
        outputs = []
        flags = dist_input.deduplicated or [False] * len(dist_input.pending)
        for group, pending, g_len, deduped in zip(self.sharding_groups(), dist_input.pending,
                                                  dist_input.lengths, flags, strict=True):
            if deduped:
                routed = cast(RoutedSharding, group)
                exchange = cast(PendingDedupExchange, pending).wait()
                outputs.append(dedup_output_dist(routed, dedup_lookup(routed, exchange),
                                                 exchange))
                continue
            received = pending.wait()
            outputs.append(group.output_dist(group.lookup(received), received, g_len))
        pooled = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
        if self.column_order is not None:
            pooled = pooled.index_select(1, cast(torch.Tensor, self.column_order))
        return KeyedTensor(self.feature_names, self.feature_dims, pooled)

    # ---- state ------------------------------------------------------------------------------
    def local_shards(self, tables: Collection[str] | None = None) -> list[LocalShard]:
        """Every shard this rank holds (weights and optimizer state as views); ``tables``:
        at least those of these tables (kernels holding none of them are not read)."""
        return [s for g in self.sharding_groups() for s in g.local_shards(tables)]

    # ---- cached shards ----------------------------------------------------------------------
    def prefetch(self, dist_input: EBCInputDist) -> None:
        """Queue the lookup of a coming batch's rows in the cached shards held here (waits
        for its ids first); a no-op without cached shards."""
        flags = dist_input.deduplicated or [False] * len(dist_input.pending)
        for group, pending, deduped in zip(self.sharding_groups(), dist_input.pending, flags,
                                           strict=True):
            if not deduped:     # a deduplicated batch's cached rows are read in its lookup
                group.prefetch(pending)

    def cached_kernels(self) -> list[CachedEmbeddingBag]:
        return [k for g in self.sharding_groups() for k in g.cached_kernels()]

    def flush(self) -> None:
        """Write the cached shards' dirty rows to their files."""
        for kernel in self.cached_kernels():
            kernel.flush()

    def cache_stats(self) -> dict[str, dict[str, float]]:
        """Per cached shard held here (``table.r<row>.c<col>``), its counters, DRAM bytes
        and lookup seconds (see :meth:`CachedEmbeddingBag.stats`)."""
        out = {}
        for kernel in self.cached_kernels():
            out.update(dict(zip(kernel.names, kernel.stats(), strict=True)))
        return out

    def data_parallel_parameters(self) -> Iterator[nn.Parameter]:
        """The replicated (data-parallel) tables: trained by the dense optimizer."""
        if ShardingType.DATA_PARALLEL.value in self.groups:
            yield from self.groups[ShardingType.DATA_PARALLEL.value].parameters()

    def fused_lookups(self) -> list[BatchedEmbeddingBag | CachedEmbeddingBag]:
        return [k for g in self.sharding_groups() for k in g.fused_lookups()]

    def load_table_weights(self, weights: Mapping[str, torch.Tensor],
                           optimizer_states: Mapping[str, Mapping[str, torch.Tensor]]
                           | None = None) -> None:
        """Copy full (unsharded) table weights, and optionally optimizer state, into the shards.

        Args:
            weights: table name -> (num_embeddings, embedding_dim).
            optimizer_states: table name -> state name -> full tensor ((rows,) for rowwise
                accumulators, (rows, dim) for elementwise ones).
        """
        with torch.no_grad():
            for shard in self.local_shards(set(weights)):
                if shard.table not in weights:
                    continue
                m = shard.metadata
                block = weights[shard.table][m.row_offset:m.row_offset + m.rows,
                                             m.col_offset:m.col_offset + m.cols]
                shard.weight.copy_(block)
                for name, state in (optimizer_states or {}).get(shard.table, {}).items():
                    if name not in shard.optimizer_state:
                        continue
                    rows = state[m.row_offset:m.row_offset + m.rows]
                    if rows.dim() == 2:
                        rows = rows[:, m.col_offset:m.col_offset + m.cols]
                    shard.optimizer_state[name].copy_(rows.reshape(
                        shard.optimizer_state[name].shape))

    def get_lr(self) -> float | None:
        lookups = self.fused_lookups()
        return lookups[0].learning_rate if lookups else None

    def set_lr(self, lr: float) -> None:
        """Set the fused optimizer's learning rate on every lookup (e.g. from a scheduler)."""
        for lookup in self.fused_lookups():
            lookup.set_learning_rate(lr)


class EmbeddingBagCollectionSharder:
    """Builds a :class:`ShardedEmbeddingBagCollection` from an EmbeddingBagCollection and a plan.

    Args:
        gradient_division: see :class:`ShardedEmbeddingBagCollection`.

    Example:
        >>> sharded = EmbeddingBagCollectionSharder().shard(ebc, plan)
    """

    def __init__(self, gradient_division: bool = True) -> None:
        self.gradient_division = gradient_division

    def sharding_types(self) -> list[str]:
        """Every type runs on CPU (gloo) and CUDA (NCCL), row-wise ones included."""
        return list(SHARDING_CLASSES)

    def shard(self, module: EmbeddingBagCollection,
              plan: ShardingPlan | Mapping[str, ParameterSharding],
              group: Any | None = None,
              local_world_size: int | None = None) -> ShardedEmbeddingBagCollection:
        """Shard ``module``'s tables per ``plan``, copying its weights and optimizer state.

        Args:
            module: the unsharded collection (every rank holds the same one).
            plan: a whole plan (validated against the module's tables here) or its entries.
            group: the process group.
            local_world_size: ranks per host (default: the plan's, else one host).
        """
        tables = module.embedding_bag_configs()
        if isinstance(plan, ShardingPlan) and local_world_size is None:
            local_world_size = plan.local_world_size
        entries = plan.tables if isinstance(plan, ShardingPlan) else plan
        if isinstance(plan, ShardingPlan):
            plan.validate({t.name: (t.num_embeddings, t.embedding_dim) for t in tables},
                          world_size=dist.get_world_size(group))
        backends = {b for b in module.backends() if b != "cached"}
        specs = module.cached_table_specs()
        cached = {}
        for t in tables:
            entry = entries.get(t.name)
            planned = entry is not None and entry.compute_kernel == ComputeKernel.FUSED_CACHED.value
            if t.name in specs or planned:
                spec = specs.get(t.name) or CachedTableSpec(0.2, table_seed(0, t.name),
                                                            t.init_range)
                if entry is not None and entry.cache_load_factor:
                    spec = dataclasses.replace(spec, load_factor=entry.cache_load_factor)
                cached[t.name] = spec
        sharded = ShardedEmbeddingBagCollection(
            tables, {t.name: entries[t.name] for t in tables if t.name in entries},
            module.optimizer, group, self.gradient_division,
            backend=backends.pop() if len(backends) == 1 else "auto",
            local_world_size=local_world_size, cached=cached)
        # Cached tables' shards start from the rule the module's cached table starts from
        # (their blocks of it): no copy, and the module's files are not read.
        copied = [t.name for t in tables if t.name not in specs]
        weights = module.embedding_bag_weights(copied)
        sharded.load_table_weights(weights, module.optimizer_state(copied))
        if ShardingType.DATA_PARALLEL.value in sharded.groups:
            dp = cast(EmbeddingSharding, sharded.groups[ShardingType.DATA_PARALLEL.value])
            with torch.no_grad():
                for table, param in zip(dp.tables, dp.parameters(), strict=True):
                    param.copy_(weights[table.name])
        return sharded


def set_dedup(model: nn.Module, mode: str, threshold: float = DEDUP_AUTO_THRESHOLD) -> int:
    """Set deduplicated lookups (``auto``, ``on``, ``off``) on every sharded collection of
    ``model``; returns how many there were (``training.dedup`` comes in here).

    Example:
        >>> set_dedup(dmp, "auto")
    """
    found = [m for m in model.modules() if isinstance(m, ShardedEmbeddingBagCollection)]
    for sebc in found:
        sebc.set_dedup(mode, threshold)
    return len(found)
