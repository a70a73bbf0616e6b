"""EmbeddingBagCollection: KeyedJaggedTensor in, pooled KeyedTensor out, on batched kernels.

Tables are grouped into one :class:`BatchedEmbeddingBag` per compatible group (same pooling
and storage type; the optimizer is one per collection), so 26 tables of a DLRM are one kernel
call. Inside a group, features are ordered by table, as FBGEMM wants them::

    tables   t_a: [f1]   t_b: [f2, f3]   (all sum pooling, fp32)
    kernel   feature_table_map = [0, 1, 1]   features f1, f2, f3
    input    KJT with keys in any order (extra keys are ignored)
    output   KeyedTensor(keys=[f1, f2, f3], length_per_key=[dim_a, dim_b, dim_b])

The embedding weights never get a ``.grad``: the optimizer runs inside backward. The
collection's ``state_dict`` shows one ``embedding_bags.<table>.weight`` per table (as TorchRec
names it) instead of the kernels' flat buffers.

Example:
    >>> ebc = EmbeddingBagCollection(
    ...     [EmbeddingBagConfig("t_C1", 1000, 16, ["C1"]), EmbeddingBagConfig("t_C2", 50, 16, ["C2"])],
    ...     optimizer=EmbeddingOptimizerConfig(kind="exact_rowwise_adagrad", lr=0.02))
    >>> kt = ebc(kjt)                  # kt.values(): (B, 32)
    >>> ebc.embedding_bag_weights()["t_C2"].shape    # torch.Size([50, 16])
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn

from ctrctl.errors import CheckpointError, ConfigError, SparseInputError
from ctrctl.modules.batched_embedding import Backend, BatchedEmbeddingBag
from ctrctl.modules.cached_embedding import CachedEmbeddingBag, CachedTableSpec, table_seed
from ctrctl.modules.embedding_configs import EmbeddingBagConfig, check_unique_names
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
from ctrctl.sparse import KeyedJaggedTensor, KeyedTensor
from ctrctl.sparse.ops import complete_cumsum


class EmbeddingBagCollection(nn.Module):
    """Pooled embedding lookups for many tables with a fused optimizer.

    Args:
        tables: the table configs; a table may serve several features.
        optimizer: the optimizer fused into backward (default exact rowwise Adagrad).
        device: where weights live ("cpu" or a CUDA device).
        backend: "auto" (the native kernel on CPU, FBGEMM where it can run, plain torch
            otherwise), "fbgemm", "native" or "torch".
        seed: seed of the weight initialisation (uniform in each config's init range).
        bounds_check: FBGEMM's id check ("warning", "fatal", "none").
        cached_tables: table name -> cache load factor for tables kept on disk with a DRAM
            row cache (the ``fused_cached`` kernel, CPU, fp32). They initialise from
            (``seed``, table name, row id), see :func:`~ctrctl.modules.cached_embedding.table_seed`.
        cache_dir: where cached tables' files go (default the system's temporary folder).

    Example:
        >>> ebc = EmbeddingBagCollection([EmbeddingBagConfig("t", 100, 8, ["f"])], seed=0)
        >>> ebc(kjt).to_dict()["f"].shape      # (B, 8)
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        optimizer: EmbeddingOptimizerConfig | None = None,
        device: torch.device | str | None = None,
        backend: Backend | str = "auto",
        seed: int | None = 0,
        bounds_check: str = "warning",
        cached_tables: Mapping[str, float] | None = None,
        cache_dir: str | None = None,
    ) -> None:
        super().__init__()
        check_unique_names(tables)
        cached = dict(cached_tables or {})
        unknown = sorted(set(cached) - {c.name for c in tables})
        if unknown:
            raise ConfigError(f"cached_tables names unknown tables {unknown}",
                              where="EmbeddingBagCollection",
                              hint=f"use table names: {[c.name for c in tables][:8]}")
        self._configs = list(tables)
        self._cache_dir = cache_dir
        self.optimizer = optimizer or EmbeddingOptimizerConfig()
        self.device = torch.device(device or "cpu")

        # Group tables that can share one kernel, keeping the config order inside a group.
        # On CUDA a cached table is FBGEMM's UVM caching (one load factor per kernel).
        uvm = self.device.type == "cuda"
        groups: dict[tuple[str, str, bool, float | None], list[int]] = {}
        for t, cfg in enumerate(self._configs):
            key = (cfg.pooling, cfg.data_type, cfg.name in cached,
                   cached.get(cfg.name) if uvm else None)
            groups.setdefault(key, []).append(t)
        self._group_tables = list(groups.values())
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        self.bags = nn.ModuleList()
        self._input_features: list[str] = []  # kernel input order: by group, then table
        self._group_sizes: list[int] = []
        self._table_slot: dict[str, tuple[int, int]] = {}  # table -> (group, index in group)
        for g, ((pooling, data_type, is_cached, uvm_factor), members) in enumerate(
                groups.items()):
            configs = [self._configs[t] for t in members]
            feature_table_map = [i for i, c in enumerate(configs) for _ in c.feature_names]
            if is_cached and not uvm:
                self.bags.append(_cached_bag(configs, feature_table_map, self.optimizer,
                                             pooling, data_type, self.device, seed, cached,
                                             cache_dir))
            else:
                weights = [c.init_weight(generator) for c in configs]
                self.bags.append(
                    BatchedEmbeddingBag(
                        [(c.num_embeddings, c.embedding_dim) for c in configs],
                        feature_table_map,
                        optimizer=self.optimizer,
                        pooling=pooling,
                        device=self.device,
                        backend=backend,
                        data_type=data_type,
                        weights=weights,
                        bounds_check=bounds_check,
                        cache_load_factor=uvm_factor,
                    )
                )
            features = [f for c in configs for f in c.feature_names]
            self._input_features += features
            self._group_sizes.append(len(features))
            for i, c in enumerate(configs):
                self._table_slot[c.name] = (g, i)

        # Output in config order; the kernels produce input order.
        self._feature_names = [f for c in self._configs for f in c.feature_names]
        dim_of = {f: c.embedding_dim for c in self._configs for f in c.feature_names}
        self._dims = [dim_of[f] for f in self._feature_names]
        self._column_index: torch.Tensor | None = None
        if self._input_features != self._feature_names:
            start, columns = 0, {}
            for f in self._input_features:
                columns[f] = torch.arange(start, start + dim_of[f])
                start += dim_of[f]
            self._column_index = torch.cat([columns[f] for f in self._feature_names])
        self._permute_cache: dict[tuple[str, ...], list[int] | None] = {}
        self._register_state_dict_hook(_save_per_table_weights)
        self._register_load_state_dict_pre_hook(_load_per_table_weights, with_module=True)

    def _kernels(self) -> list[BatchedEmbeddingBag]:
        return [cast(BatchedEmbeddingBag, bag) for bag in self.bags]

    # ---- lookups ------------------------------------------------------------------------

    def _input_permutation(self, keys: list[str]) -> list[int] | None:
        """Indices that bring ``keys`` to kernel input order (None when already in it)."""
        cache_key = tuple(keys)
        if cache_key not in self._permute_cache:
            if keys == self._input_features:
                self._permute_cache[cache_key] = None
            else:
                position = {k: i for i, k in enumerate(keys)}
                missing = [f for f in self._input_features if f not in position]
                if missing:
                    raise SparseInputError(
                        f"features {missing} are missing from the batch (keys {keys})",
                        where="EmbeddingBagCollection",
                        hint="every feature of every table needs a key, even with empty bags",
                    )
                self._permute_cache[cache_key] = [position[f] for f in self._input_features]
        return self._permute_cache[cache_key]

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Pool each feature's bags: (B, sum of dims), keys in config order.

        Args:
            features: the batch; weights, if present, make the pooling weighted.
        """
        order = self._input_permutation(features.keys())
        kjt = features if order is None else features.permute(order)
        if kjt.variable_stride_per_key():
            pooled = self._pool_distinct(kjt)
        elif len(self.bags) == 1:
            pooled = self.bags[0](kjt.values(), kjt.offsets(), kjt.weights_or_none())
        else:
            parts = kjt.split(self._group_sizes)
            pooled = torch.cat(
                [
                    bag(part.values(), part.offsets(), part.weights_or_none())
                    for bag, part in zip(self._kernels(), parts, strict=True)
                ],
                dim=1,
            )
        if self._column_index is not None:
            pooled = pooled.index_select(1, self._column_index.to(pooled.device))
        return KeyedTensor(self._feature_names, self._dims, pooled)  # (B, sum of dims)

    def _pool_distinct(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        """A deduplicated batch (:func:`ctrctl.sparse.dedup.deduplicate`): pool each
        feature's distinct bags once, then put them in batch order -> (B, sum of dims)."""
        names, inverse = kjt.inverse_indices()
        row = {n: i for i, n in enumerate(names)}
        dims = dict(zip(self._feature_names, self._dims, strict=True))
        parts = kjt.split(self._group_sizes) if len(self.bags) > 1 else [kjt]
        out = []
        for bag, part in zip(self._kernels(), parts, strict=True):
            strides = part.stride_per_key()
            widest = max(strides, default=0)
            # one kernel call: each feature padded with empty bags to the widest
            padded = part.lengths().new_zeros(len(strides), widest)
            start = 0
            for k, n in enumerate(strides):
                padded[k, :n] = part.lengths()[start:start + n]
                start += n
            pooled = bag(part.values(), complete_cumsum(padded.view(-1)),
                         part.weights_or_none())                          # (widest, W_g)
            col = 0
            for key, n in zip(part.keys(), strides, strict=True):
                rows = pooled[:n, col:col + dims[key]]                      # (U_f, D_f)
                out.append(rows.index_select(0, inverse[row[key]]))         # (B, D_f)
                col += dims[key]
        return torch.cat(out, dim=1)

    # ---- cached tables ------------------------------------------------------------------

    def _cached_bags(self) -> list[tuple[int, CachedEmbeddingBag]]:
        return [(g, bag) for g, bag in enumerate(self.bags) if isinstance(bag, CachedEmbeddingBag)]

    def prefetch(self, features: KeyedJaggedTensor) -> None:
        """Start bringing a coming batch's rows into the caches of cached tables (no-op for
        resident ones); call it for batch i+1 while batch i computes, with the same KJT."""
        cached = self._cached_bags() + self._uvm_bags()
        if not cached:
            return
        order = self._input_permutation(features.keys())
        kjt = features if order is None else features.permute(order)
        parts = kjt.split(self._group_sizes) if len(self.bags) > 1 else [kjt]
        for g, bag in cached:
            bag.prefetch(parts[g].values(), parts[g].offsets())

    def _uvm_bags(self) -> list[tuple[int, BatchedEmbeddingBag]]:
        return [(g, bag) for g, bag in enumerate(self.bags)
                if isinstance(bag, BatchedEmbeddingBag) and bag.cache_counters()]

    def flush(self) -> None:
        """Write the cached tables' dirty rows to their files."""
        for _, bag in self._cached_bags():
            bag.flush()

    def cached_table_specs(self) -> dict[str, CachedTableSpec]:
        """Per cached table name, how it is kept (a sharded copy keeps its shards so)."""
        out = {}
        for g, bag in self._cached_bags():
            for cfg in self._configs:
                slot = self._table_slot[cfg.name]
                if slot[0] == g:
                    cache = bag.caches[slot[1]]
                    out[cfg.name] = CachedTableSpec(
                        cache.load_factor, cache.store.seed, cache.store.init_range,
                        self._cache_dir)
        return out

    def cache_counters(self) -> dict[str, dict[str, int]]:
        """Per cached table name, its cache counters (see :class:`CachedEmbeddingBag`); on
        CUDA, per UVM-cached kernel (its tables' names joined by ``+``), FBGEMM's."""
        out = {"+".join(c.name for c in self._configs if self._table_slot[c.name][0] == g):
               bag.cache_counters() for g, bag in self._uvm_bags()}
        for g, bag in self._cached_bags():
            for cfg in self._configs:
                if self._table_slot[cfg.name][0] == g:
                    out[cfg.name] = bag.counters()[self._table_slot[cfg.name][1]]
        return out

    def cache_stats(self) -> dict[str, dict[str, float]]:
        """Per cached table name, its counters, DRAM bytes and lookup seconds
        (see :meth:`CachedEmbeddingBag.stats`)."""
        out = {}
        for g, bag in self._cached_bags():
            stats = bag.stats()
            for cfg in self._configs:
                if self._table_slot[cfg.name][0] == g:
                    out[cfg.name] = stats[self._table_slot[cfg.name][1]]
        return out

    # ---- configuration and state --------------------------------------------------------

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return list(self._configs)

    def feature_names(self) -> list[str]:
        """Output keys, in config order."""
        return list(self._feature_names)

    def length_per_feature(self) -> list[int]:
        """Output width (embedding dim) of each feature, in :meth:`feature_names` order."""
        return list(self._dims)

    def backends(self) -> list[str]:
        """The kernel each group runs on ("fbgemm", "native", "torch" or "cached")."""
        return [bag.backend for bag in self._kernels()]

    def _groups_of(self, names: Collection[str] | None) -> set[int]:
        wanted = {c.name for c in self._configs} if names is None else set(names)
        return {self._table_slot[n][0] for n in wanted if n in self._table_slot}

    def embedding_bag_weights(self, names: Collection[str] | None = None
                              ) -> dict[str, torch.Tensor]:
        """One (rows, dim) view per table name (writes go through; clone to snapshot).

        ``names``: only these tables (a cached table's kernel is then not read at all: reading
        it writes the whole table to its file)."""
        groups = self._groups_of(names)
        split = {g: bag.split_weights() for g, bag in enumerate(self._kernels()) if g in groups}
        out = {}
        for cfg in self._configs:
            g, i = self._table_slot[cfg.name]
            if names is None or cfg.name in names:
                out[cfg.name] = split[g][i]
        return out

    @torch.no_grad()
    def load_embedding_bag_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Copy (rows, dim) weights by table name; every table must be given."""
        targets = self.embedding_bag_weights()
        missing = sorted(set(targets) - set(weights))
        unknown = sorted(set(weights) - set(targets))
        if missing or unknown:
            problems = [f"weights for tables {missing} are missing"] if missing else []
            problems += [f"tables {unknown} are unknown"] if unknown else []
            raise CheckpointError(
                "; ".join(problems),
                where="EmbeddingBagCollection.load_embedding_bag_weights",
                hint="load weights saved from a collection with the same tables",
            )
        for name, target in targets.items():
            if tuple(weights[name].shape) != tuple(target.shape):
                raise CheckpointError(
                    f"table {name!r}: weight of shape {tuple(weights[name].shape)} does not fit "
                    f"{tuple(target.shape)}",
                    where="EmbeddingBagCollection.load_embedding_bag_weights",
                )
            target.copy_(weights[name])

    def optimizer_state(self, names: Collection[str] | None = None
                        ) -> dict[str, dict[str, torch.Tensor]]:
        """Fused optimizer state per table name, e.g. {"t_C1": {"momentum1": (rows,)}}
        (``names``: only these tables, as :meth:`embedding_bag_weights`)."""
        groups = self._groups_of(names)
        states = {g: bag.optimizer_state() for g, bag in enumerate(self._kernels())
                  if g in groups}
        out = {}
        for cfg in self._configs:
            g, i = self._table_slot[cfg.name]
            if names is None or cfg.name in names:
                out[cfg.name] = states[g][i]
        return out

    @torch.no_grad()
    def load_optimizer_state(self, states: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        """Copy fused optimizer state by table name (as :meth:`optimizer_state` gives it)."""
        targets = self.optimizer_state()
        missing = sorted(set(targets) - set(states))
        if missing:
            raise CheckpointError(
                f"optimizer state for tables {missing} is missing",
                where="EmbeddingBagCollection.load_optimizer_state",
            )
        for name, target in targets.items():
            if set(target) != set(states[name]):
                raise CheckpointError(
                    f"table {name!r}: optimizer state has {sorted(states[name])}, expected "
                    f"{sorted(target)}",
                    where="EmbeddingBagCollection.load_optimizer_state",
                    hint="resume with the same embedding optimizer",
                )
            for key, tensor in target.items():
                tensor.copy_(states[name][key].reshape(tensor.shape))

    def set_learning_rate(self, lr: float) -> None:
        """Change the fused optimizer's learning rate for every table."""
        for bag in self._kernels():
            bag.set_learning_rate(lr)


def _cached_bag(
    configs: Sequence[EmbeddingBagConfig],
    feature_table_map: list[int],
    optimizer: EmbeddingOptimizerConfig,
    pooling: str,
    data_type: str,
    device: torch.device,
    seed: int | None,
    load_factors: Mapping[str, float],
    cache_dir: str | None,
) -> CachedEmbeddingBag:
    """The ``fused_cached`` kernel for a group of cached tables."""
    where = f"EmbeddingBagCollection cached tables {[c.name for c in configs]}"
    if device.type != "cpu":
        raise ConfigError(f"cached tables run on CPU, not {device}", where=where,
                          hint="keep them resident (fused) on CUDA")
    if data_type != "fp32":
        raise ConfigError(f"cached tables store fp32 only, not {data_type}", where=where)
    base = seed if seed is not None else int(torch.randint(0, 2**31, ()).item())
    return CachedEmbeddingBag(
        [(c.num_embeddings, c.embedding_dim) for c in configs],
        feature_table_map,
        optimizer,
        pooling,
        cache_load_factor=[load_factors[c.name] for c in configs],
        seeds=[table_seed(base, c.name) for c in configs],
        init_ranges=[c.init_range for c in configs],
        cache_dir=cache_dir,
        names=[c.name for c in configs],
    )


def _save_per_table_weights(
    module: EmbeddingBagCollection, state_dict: dict[str, Any], prefix: str, local_metadata: Any
) -> None:
    """state_dict post-hook: replace the kernels' buffers by one weight per table."""
    for key in [k for k in state_dict if k.startswith(prefix + "bags.")]:
        del state_dict[key]
    for name, weight in module.embedding_bag_weights().items():
        state_dict[f"{prefix}embedding_bags.{name}.weight"] = weight.detach()


def _load_per_table_weights(
    module: EmbeddingBagCollection,
    state_dict: dict[str, Any],
    prefix: str,
    local_metadata: Any,
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    """load_state_dict pre-hook: copy per-table weights in; let the kernels load themselves."""
    weights = module.embedding_bag_weights()
    with torch.no_grad():
        for name, target in weights.items():
            key = f"{prefix}embedding_bags.{name}.weight"
            if key not in state_dict:
                missing_keys.append(key)
                continue
            source = state_dict.pop(key)
            if tuple(source.shape) != tuple(target.shape):
                error_msgs.append(
                    f"{key}: shape {tuple(source.shape)} does not fit {tuple(target.shape)}"
                )
                continue
            target.copy_(source)
    # The kernels' own buffers are not in a per-table state_dict: keep their current values.
    for key, value in module.bags.state_dict(prefix=prefix + "bags.", keep_vars=True).items():
        state_dict.setdefault(key, value)
