"""The model a pipeline config describes, and the few places where training touches its insides.

Everything the loop, checkpoints, scoring and quantization need from a model goes through
here:
building a DLRM from the config and the manifest, wrapping it for several ranks
(:func:`wrap_model`, the single integration point with DistributedModelParallel), and moving
table and dense state in and out of checkpoints. An unsharded model and a sharded one look
the same from outside: a list of table blocks (:class:`~ctrctl.checkpoint.TableShard`)
plus a dense state dict.

Example:
    >>> model = build_model(config, manifest, torch.device("cpu"))
    >>> shards = dist_ckpt.table_shards(model)   # [TableShard("C1", 0, 0, weight, state), ...]
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ctrctl.config import EmbeddingOptimizerSection, PipelineConfig
from ctrctl.data.manifest import DatasetManifest
from ctrctl.distributed import checkpoint as dist_ckpt  # a module: it imports training
from ctrctl.distributed.types import ShardingPlan
from ctrctl.errors import CheckpointError, ConfigError
from ctrctl.modules import (
    DLRM,
    CollisionConfig,
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    ManagedCollisionCollection,
)
from ctrctl.modules.batched_embedding import Backend
from ctrctl.modules.dlrm import Interaction
from ctrctl.modules.embedding_configs import PoolingType
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig

__all__ = [
    "EMBEDDING_KINDS",
    "build_model",
    "dlrm_from_manifest",
    "dense_parameters",
    "dense_state",
    "embedding_optimizer",
    "load_dense_state",
    "load_tables",
    "table_info",
    "wrap_model",
]


#: Config names -> the kernel's (FBGEMM's) names of the exact optimizers.
EMBEDDING_KINDS = {
    "rowwise_adagrad": "exact_rowwise_adagrad",
    "adagrad": "exact_adagrad",
    "sgd": "exact_sgd",
}


def embedding_optimizer(section: EmbeddingOptimizerSection) -> EmbeddingOptimizerConfig:
    """The kernels' fused optimizer settings from the pipeline YAML's section.

    A ``weight_decay`` is applied as an L2 term on the gradient (rowwise Adagrad only, as the
    kernels implement it).
    """
    return EmbeddingOptimizerConfig(
        kind=EMBEDDING_KINDS[section.kind],  # type: ignore[arg-type]
        lr=section.lr,
        eps=section.eps,
        weight_decay=section.weight_decay,
        weight_decay_mode="l2" if section.weight_decay else "none",
    )

def build_model(config: PipelineConfig, manifest: DatasetManifest,
                device: torch.device) -> nn.Module:
    """A DLRM with one table per sparse feature (named as the feature) of the manifest, sized by it.

    Tables are initialised from ``training.seed``, the MLPs from torch's global RNG (seed it
    first for a repeatable run). A dataset without dense features gets no dense arch
    (``model.dense_arch`` is ignored). ``model.kind: two_tower`` builds a
    :class:`~ctrctl.modules.two_tower.TwoTower` instead (:mod:`ctrctl.models.two_tower`).
    """
    m = config.model
    if m.kind == "two_tower":
        from ctrctl.models.two_tower import build_two_tower

        if device.type == "cpu":
            _check_tables_fit(manifest, m.embedding_dim, set())
        return build_two_tower(config, manifest, device,
                               embedding_optimizer(config.embedding_optimizer))
    if not manifest.sparse:
        raise ConfigError("the dataset has no sparse features to embed",
                          where="manifest.json", hint="a DLRM needs at least one")
    if manifest.dense and not m.dense_arch:
        raise ConfigError(f"the dataset has {len(manifest.dense)} dense features but "
                          "model.dense_arch is empty",
                          hint=f"give a dense_arch ending at embedding_dim, e.g. "
                          f"[64, {m.embedding_dim}]")
    if device.type == "cpu":
        _check_tables_fit(manifest, m.embedding_dim, set(m.cached_tables))
    return dlrm_from_manifest(
        manifest,
        embedding_dim=m.embedding_dim,
        dense_arch_layer_sizes=list(m.dense_arch),
        over_arch_layer_sizes=list(m.over_arch),
        optimizer=embedding_optimizer(config.embedding_optimizer),
        interaction=m.resolved_interaction(len(manifest.dense), len(manifest.sparse)),
        dcn_num_layers=m.dcn_layers,
        dcn_low_rank_dim=m.dcn_rank,
        device=device,
        seed=config.training.seed,
        dense_autocast=config.training.bf16,
        cached_tables=m.cached_tables,
        cache_dir=m.cache_dir,
        first_order=m.first_order,
        dropout=m.dropout,
    )


def _host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _check_tables_fit(manifest: DatasetManifest, dim: int, cached: set[str]) -> None:
    """Refuse tables whose fp32 weights alone exceed this machine's memory.

    A ``hash_size`` of 2**40 was preprocessed without a word, then died in the allocator
    with a traceback. Cached tables live on disk and are not counted.
    """
    held = {name: rows for name, rows in manifest.table_sizes().items() if name not in cached}
    need = sum(held.values()) * dim * 4  # fp32 weights; optimizer state comes on top
    memory = _host_memory_bytes()
    if not held or need <= memory:
        return
    name, rows = max(held.items(), key=lambda item: item[1])
    raise ConfigError(
        f"the embedding tables do not fit in memory: {sum(held.values()):,} rows x {dim} "
        f"take {need / 2**30:,.1f} GiB, this machine has {memory / 2**30:,.1f} GiB "
        f"(the largest, {name!r}, has {rows:,} rows)", where="manifest.json",
        hint=f"lower {name}'s hash_size in the schema and preprocess again, keep the table "
             "on disk (model.cached_tables), or shard it over more ranks (ctrctl plan)")


def dlrm_from_manifest(
    manifest: DatasetManifest,
    embedding_dim: int,
    dense_arch_layer_sizes: Sequence[int],
    over_arch_layer_sizes: Sequence[int],
    optimizer: EmbeddingOptimizerConfig | None = None,
    interaction: Interaction | str = "dot",
    dcn_num_layers: int = 3,
    dcn_low_rank_dim: int = 512,
    pooling: PoolingType = "sum",
    device: torch.device | str | None = None,
    backend: Backend | str = "auto",
    seed: int | None = 0,
    dense_autocast: bool = False,
    cached_tables: dict[str, float] | None = None,
    cache_dir: str | None = None,
    first_order: bool = True,
    dropout: float = 0.0,
) -> DLRM:
    """A DLRM for a preprocessed dataset: one table per sparse feature, named as the feature.

    Args:
        manifest: the dataset's manifest (dense features, sparse features and table sizes).
        embedding_dim: D for every table; ``dense_arch_layer_sizes`` must end with it (a
            dataset without dense features ignores them).
        dense_arch_layer_sizes, over_arch_layer_sizes, interaction, dcn_*, first_order,
            dropout: see :class:`DLRM`.
        optimizer: the fused embedding optimizer.
        pooling: pooling of every table (multi-hot features use it).
        device, backend, seed: see :class:`EmbeddingBagCollection`.
        cached_tables: table name -> cache load factor of tables kept on disk with a DRAM row
            cache (``"*"``: every table not named); ``cache_dir`` where their files go.

    Example:
        >>> model = dlrm_from_manifest(DatasetManifest.load("data/criteo"), 64,
        ...                            [512, 256, 64], [512, 256, 1])
    """
    if not manifest.sparse:
        raise ConfigError("the dataset has no sparse features", where="dlrm_from_manifest")
    tables = [
        EmbeddingBagConfig(
            name=feature.name,  # one table per feature, named as the feature (plan.json too)
            num_embeddings=feature.num_embeddings,
            embedding_dim=embedding_dim,
            feature_names=[feature.name],
            pooling=pooling,
        )
        for feature in manifest.sparse
    ]
    cached = dict(cached_tables or {})
    every = cached.pop("*", None)
    unknown = sorted(set(cached) - {t.name for t in tables})
    if unknown:
        raise ConfigError(f"model.cached_tables names unknown tables {unknown}",
                          hint=f"tables are named as the sparse features: "
                          f"{[t.name for t in tables][:8]}")
    if every is not None:
        cached = {t.name: cached.get(t.name, every) for t in tables}
    ebc = EmbeddingBagCollection(
        tables, optimizer=optimizer, device=device, backend=backend, seed=seed,
        cached_tables=cached, cache_dir=cache_dir,
    )
    model = DLRM(
        ebc,
        collisions=managed_collisions(manifest, tables, seed or 0),
        dense_in_features=len(manifest.dense),
        dense_arch_layer_sizes=dense_arch_layer_sizes,
        over_arch_layer_sizes=over_arch_layer_sizes,
        interaction=interaction,
        dcn_num_layers=dcn_num_layers,
        dcn_low_rank_dim=dcn_low_rank_dim,
        dense_autocast=dense_autocast,
        first_order=first_order,
        dropout=dropout,
    )
    return model.to(device or "cpu")


def managed_collisions(manifest: DatasetManifest, tables: Sequence[EmbeddingBagConfig],
                       seed: int = 0) -> ManagedCollisionCollection | None:
    """The remappers of the manifest's ``zch`` features (None when it has none)."""
    configs = {
        f.name: CollisionConfig(
            capacity=f.num_embeddings, eviction=f.collision.get("eviction", "lfu"),
            ttl_days=f.collision.get("ttl_days"),
            admit_min_count=int(f.collision.get("admit_min_count", 1)),
            shards=int(f.collision.get("shards", 1)))
        for f in manifest.sparse if f.mode == "zch" and f.collision is not None
    }
    return ManagedCollisionCollection(configs, tables, seed=seed) if configs else None


def wrap_model(model: nn.Module, plan: ShardingPlan | None, process_group: Any,
               dense_process_group: Any | None = None) -> nn.Module:
    """Shard the model's tables across the ranks of ``process_group`` per ``plan``.

    The one place where the trainer meets DistributedModelParallel; ``plan`` None asks it
    for its default plan; ``dense_process_group``: where DDP all-reduces dense gradients
    (default ``process_group``).
    """
    try:
        from ctrctl.distributed.model_parallel import DistributedModelParallel
    except ImportError as exc:
        raise ConfigError(
            "training on several processes needs ctrctl.distributed.model_parallel, which "
            "this installation lacks", hint="train with --nproc-per-node 1") from exc
    dmp = DistributedModelParallel(model, plan=plan, process_group=process_group,
                                   dense_process_group=dense_process_group)
    collisions = getattr(_unwrap(model), "collisions", None)
    if isinstance(collisions, ManagedCollisionCollection):
        # Each remapper shard lives on the rank holding its first row (spread over the
        # holders where every rank holds every row); ranks exchange a step's keys and slots.
        import torch.distributed as dist

        group = process_group if process_group is not None else dist.group.WORLD
        collisions.process_group = group
        collisions.place({name: [(s.rank, s.row_offset, s.rows) for s in entry.shards]
                          for name, entry in dmp.plan.tables.items()}, dist.get_rank(group))
    return dmp


# ---- finding the parts ---------------------------------------------------------------------
def _collision_modules(model: nn.Module) -> list[tuple[str, ManagedCollisionCollection]]:
    """(state-dict prefix, module) of every managed-collision collection in ``model``."""
    return [(name, m) for name, m in _unwrap(model).named_modules()
            if isinstance(m, ManagedCollisionCollection) and name]


def _unwrap(model: nn.Module) -> nn.Module:
    """The DLRM inside wrappers (DMP, DDP) that keep it as ``.module``."""
    inner = model
    while hasattr(inner, "module") and isinstance(inner.module, nn.Module):
        inner = inner.module
    return inner


def _embedding_modules(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(name, module) of every embedding collection, sharded or not, outermost only."""
    found: list[str] = []
    for name, module in _unwrap(model).named_modules():
        if any(name.startswith(f + ".") for f in found):
            continue
        if hasattr(module, "local_shards") or isinstance(module, EmbeddingBagCollection):
            found.append(name)
            yield name, module


def dense_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Parameters the dense optimizer steps: all but the fused tables (DP tables included)."""
    inner = _unwrap(model)
    if hasattr(model, "dense_parameters"):
        return list(model.dense_parameters())  # type: ignore[operator]
    if hasattr(inner, "dense_parameters"):
        return list(inner.dense_parameters())  # type: ignore[operator]
    fused = {id(p) for _, m in _embedding_modules(model) for p in m.parameters()}
    return [p for p in inner.parameters() if id(p) not in fused]


def _is_embedding_key(key: str, prefixes: list[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes if p)


def dense_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict without the embedding tables (they go to table pieces), with
    every managed-collision shard whichever rank holds it (a collective once the remappers
    are placed over ranks: every rank calls this together)."""
    prefixes = [name for name, _ in _embedding_modules(model)]
    state = {k: v for k, v in _unwrap(model).state_dict().items()
             if not _is_embedding_key(k, prefixes)}
    for prefix, collisions in _collision_modules(model):
        state = {k: v for k, v in state.items() if not _is_embedding_key(k, [prefix])}
        state.update({f"{prefix}.{k}": v for k, v in collisions.full_state_dict().items()})
    return state


def load_dense_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a :func:`dense_state` into the model (tables untouched)."""
    inner = _unwrap(model)
    prefixes = [name for name, _ in _embedding_modules(model)]
    for prefix, collisions in _collision_modules(model):
        # Each remapper shard takes its part of the whole saved state (it reshards here).
        collisions.load_full_state_dict({k[len(prefix) + 1:]: v for k, v in state.items()
                                         if _is_embedding_key(k, [prefix])})
        prefixes.append(prefix)
        state = {k: v for k, v in state.items() if not _is_embedding_key(k, [prefix])}
    expected = {k for k in inner.state_dict() if not _is_embedding_key(k, prefixes)}
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise CheckpointError(
            f"the dense state does not fit the model (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]})",
            hint="load it into a model built from the checkpoint's own config")
    inner.load_state_dict(state, strict=False)


# ---- tables ------------------------------------------------------------------------------
def table_info(model: nn.Module, config: PipelineConfig) -> dict[str, dict[str, Any]]:
    """Per table: rows, dim and the embedding optimizer (the checkpoint's table entries)."""
    info = {}
    for _, module in _embedding_modules(model):
        configs = (module.embedding_bag_configs() if isinstance(module, EmbeddingBagCollection)
                   else getattr(module, "tables", []))
        for t in configs:
            info[t.name] = {"rows": t.num_embeddings, "dim": t.embedding_dim,
                            "optimizer": EMBEDDING_KINDS[config.embedding_optimizer.kind]}
    return info


def load_tables(model: nn.Module, path: str | Path, with_optimizer: bool = True) -> None:
    """Fill the model's table blocks (and optimizer state) from a checkpoint of any layout."""
    dist_ckpt.load_sharded(path, model, with_optimizer=with_optimizer)
