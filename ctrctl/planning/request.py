"""``ctrctl plan`` as a library call: resolve the inputs, plan, save, track.

Inputs come from one of a dataset (``manifest.json``), a tables YAML or a pipeline config
(its ``model``, ``embedding_optimizer``, ``training.batch_size`` and ``plan`` sections, and
its dataset ``preprocess.out`` when no other table source is given); explicit arguments win
over the config.

Example:
    >>> outcome = run_plan(PlanRequest(tables=Path("tables.yaml"), world_size=8,
    ...                                device="h100", out=Path("plan.json")))
    >>> outcome.result.step_time
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrctl.distributed.planner.capacity import (
    SweepPoint,
    smallest_world_size,
    sweep_world_sizes,
)
from ctrctl.distributed.planner.planner import EmbeddingShardingPlanner, PlanResult
from ctrctl.distributed.planner.stats import plan_summary, summary_metrics
from ctrctl.distributed.planner.tables import (
    constraints_from_dict,
    tables_from_manifest,
    tables_from_yaml,
)
from ctrctl.distributed.planner.topology import GIB, Topology
from ctrctl.distributed.planner.types import TableSpec
from ctrctl.errors import ConfigError, OutputExistsError
from ctrctl.names import ShardingType
from ctrctl.tracking import Tracker

logger = logging.getLogger(__name__)

#: Per-rank batch when neither the command nor a config says (TorchRec's default).
DEFAULT_BATCH_SIZE = 512


@dataclass(frozen=True)
class PlanRequest:
    """What ``ctrctl plan`` was asked (None: take it from the config or the default).

    Attributes:
        dataset, config, tables: where the tables come from (one of them).
        world_size: ranks; None finds the smallest that fits (``--world-size auto``).
        local_world_size: ranks per host.
        device: ``cpu``, ``cuda`` (TorchRec's GPU defaults) or a preset (``h100`` ...).
        hbm_gb, ddr_gb: memory per rank, replacing the preset's.
        batch_size: samples per rank per step (a config's global batch is divided).
        sharding_type: force this type on every table.
        embedding_dim, optimizer: for tables from a dataset.
        topology: a ``topology.json`` (e.g. from ``--calibrate``) instead of a preset.
        out: where ``plan.json`` goes (None: do not write).
        overwrite: replace an existing ``out``.
    """

    dataset: Path | None = None
    config: Path | None = None
    tables: Path | None = None
    world_size: int | None = 1
    local_world_size: int | None = None
    device: str | None = None
    hbm_gb: float | None = None
    ddr_gb: float | None = None
    batch_size: int | None = None
    sharding_type: str | None = None
    embedding_dim: int | None = None
    optimizer: str | None = None
    topology: Path | None = None
    out: Path | None = None
    overwrite: bool = False


@dataclass
class PlanOutcome:
    """The plan, the capacity sweep (for ``auto``), and what was resolved."""

    result: PlanResult
    tables: list[TableSpec]
    sweep: list[SweepPoint] = field(default_factory=list)
    resolved: dict[str, Any] = field(default_factory=dict)

    @property
    def summary(self) -> dict[str, Any]:
        return plan_summary(self.result)


def dense_model_bytes(cfg: Any, num_dense: int, num_tables: int, batch_per_rank: int
                      ) -> float:
    """Memory per rank for the dense part of the config's DLRM: parameters, gradients and
    optimizer state of both MLPs, and their activations (forward and gradient) for a batch.

    The top MLP reads the dense vector plus one dot product per pair of the ``F + 1``
    vectors (DLRM's dot interaction), or ``(F + 1) x dim`` features for DCN; without dense
    features, the learned vector of ``model.first_order`` stands in for the dense vector
    (dot), or the ``F`` embeddings are alone (the pairs of them, or ``F x dim``).
    """
    model = cfg.model
    dim = model.embedding_dim
    interaction = model.resolved_interaction(num_dense, num_tables)
    # Without dense features there is no bottom MLP; the dot interaction may have the
    # learned vector in the dense vector's place (DLRM's first_order).
    anchored = bool(num_dense) or (interaction == "dot" and model.first_order)
    vectors = num_tables + 1 if anchored else num_tables
    if interaction == "dot":
        top_in = vectors * (vectors - 1) // 2 + (dim if anchored else 0)
    else:
        top_in = vectors * dim
    params, widths = 0, 0
    arches = ([(num_dense, model.dense_arch)] if num_dense else []) + [(top_in, model.over_arch)]
    for first, layers in arches:
        previous = first
        for width in layers:
            params += previous * width + width
            widths += width
            previous = width
    states = {"adagrad": 1, "adam": 2, "sgd": 0}.get(cfg.dense_optimizer.kind, 2)
    return 4.0 * (params * (2 + states) + 2 * batch_per_rank * (widths + top_in))


def _with_config_constraints(tables: list[TableSpec], cfg: Any, where: str
                             ) -> list[TableSpec]:
    """The tables with the config's ``plan.constraints`` in place of their own, by name.

    Raises:
        ConfigError: when a constraint names a table that is not planned, or is invalid.
    """
    wanted = cfg.plan.constraints
    if not wanted:
        return tables
    names = [t.name for t in tables]
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        shown = ", ".join(names[:10]) + (" ..." if len(names) > 10 else "")
        raise ConfigError(f"plan.constraints name tables that are not planned: "
                          f"{', '.join(repr(u) for u in unknown)}",
                          where=where, hint=f"tables: {shown}")
    by_name = {name: constraints_from_dict(c.as_dict(), f"{where}: plan.constraints.{name}")
               for name, c in wanted.items()}
    return [dataclasses.replace(t, constraints=by_name[t.name]) if t.name in by_name else t
            for t in tables]


def _resolve(request: PlanRequest) -> tuple[list[TableSpec], Topology, int, bool,
                                            dict[str, Any]]:
    sources = [s for s in (request.dataset, request.tables) if s is not None]
    if len(sources) > 1:
        raise ConfigError("give one of --dataset and --tables", hint="not both")
    cfg = None
    if request.config is not None:
        from ctrctl.config import load_config

        cfg = load_config(request.config)
    if not sources and cfg is None:
        raise ConfigError("nothing to plan", hint="give --dataset DIR, --tables FILE or "
                          "--config FILE")
    optimizer = request.optimizer or (cfg.embedding_optimizer.kind if cfg else
                                      "rowwise_adagrad")
    num_dense = 13  # DLRM's Criteo default when no dataset says otherwise
    train_rows: int | None = None
    zch_bytes = 0  # managed-collision remappers: priced with their tables' rows
    if request.tables is not None:
        tables = tables_from_yaml(request.tables, optimizer=optimizer)
        dataset = None
    else:
        dataset = request.dataset
        if dataset is None and cfg is not None:
            if not cfg.preprocess.out:
                raise ConfigError("the config names no dataset (preprocess.out)",
                                  where=str(request.config), hint="pass --dataset DIR")
            dataset = Path(cfg.preprocess.out)
        from ctrctl.data.manifest import DatasetManifest

        if request.embedding_dim is not None and request.embedding_dim < 1:
            raise ConfigError(f"--embedding-dim must be at least 1, not {request.embedding_dim}",
                              hint="e.g. --embedding-dim 16, or leave it out for the config's")
        dim = request.embedding_dim or (cfg.model.embedding_dim if cfg else None)
        if dim is None:
            from ctrctl.config import ModelConfig

            dim = ModelConfig.model_validate({}).embedding_dim
        assert dataset is not None
        manifest = DatasetManifest.load(dataset)
        tables = with_remappers(tables_from_manifest(manifest, embedding_dim=dim,
                                                     optimizer=optimizer), manifest)
        zch_bytes = collision_state_bytes(manifest)
        num_dense = len(manifest.dense)
        train_rows = manifest.splits["train"].rows if "train" in manifest.splits else None
    if cfg is not None:
        tables = _with_config_constraints(tables, cfg, str(request.config))

    world = request.world_size
    auto = world is None
    start_world = 1 if auto else int(world)  # type: ignore[arg-type]
    if cfg is not None and request.world_size == 1 and cfg.plan.world_size != 1:
        start_world = cfg.plan.world_size
    local = request.local_world_size or (cfg.plan.local_world_size if cfg else None)
    device = request.device or (cfg.plan.device if cfg else "cpu")
    if request.topology is not None:
        topology = Topology.load(request.topology, start_world,
                                 local or min(start_world, 8))
        if request.hbm_gb is not None:
            topology = dataclasses.replace(topology, hbm_bytes=request.hbm_gb * GIB)
        if request.ddr_gb is not None:
            topology = dataclasses.replace(topology, ddr_bytes=request.ddr_gb * GIB)
    else:
        preset = {"cuda": "torchrec"}.get(device, device)
        topology = Topology.preset(
            preset, start_world, local,
            hbm_bytes=None if request.hbm_gb is None else request.hbm_gb * GIB,
            ddr_bytes=None if request.ddr_gb is None else request.ddr_gb * GIB)
        if auto and local is None:
            topology = topology.with_world(1, 8 if topology.device == "cuda" else 1)
    global_batch = False
    if request.batch_size is not None:
        batch = request.batch_size
    elif cfg is not None and cfg.training.batch_size is not None:
        batch, global_batch = cfg.training.batch_size, True
    elif cfg is not None and train_rows:
        # The batch training would choose from the data (training.batch_size: null).
        from ctrctl.training.sizes import auto_batch_size

        batch, global_batch = auto_batch_size(train_rows, topology.world_size), True
    else:
        batch = DEFAULT_BATCH_SIZE
    if cfg is not None:
        per_rank = max(batch // topology.world_size, 1) if global_batch else batch
        topology = dataclasses.replace(topology, dense_bytes=dense_model_bytes(
            cfg, num_dense, len(tables), per_rank))
    resolved = {"dataset": str(dataset) if dataset else None,
                "zch_state_bytes": zch_bytes,
                "tables_file": str(request.tables) if request.tables else None,
                "config": str(request.config) if request.config else None,
                "device": topology.device, "optimizer": optimizer,
                "batch_size": batch, "batch_is_global": global_batch,
                "world_size": "auto" if auto else start_world,
                "local_world_size": topology.local_world_size,
                "sharding_type": request.sharding_type
                or (",".join(cfg.plan.sharding_types) if cfg and cfg.plan.sharding_types
                    else None),
                "topology_file": str(request.topology) if request.topology else None}
    return tables, topology, batch, global_batch, resolved


def run_plan(request: PlanRequest, tracker: Tracker | None = None) -> PlanOutcome:
    """Resolve the request, plan (or find the smallest world size), save and track.

    Raises:
        ConfigError: for missing or conflicting inputs.
        OutputExistsError: when ``out`` exists and ``overwrite`` is off.
        PlanError: when nothing fits, saying why and what would.
    """
    if request.out is not None and request.out.exists() and not request.overwrite:
        raise OutputExistsError("the plan exists", where=str(request.out),
                                hint="pass --overwrite to replace it")
    if request.sharding_type is not None and request.sharding_type not in {
            t.value for t in ShardingType}:
        raise ConfigError(f"unknown sharding type {request.sharding_type!r}",
                          hint=f"use one of {[t.value for t in ShardingType]}")
    tables, topology, batch, global_batch, resolved = _resolve(request)
    forced: tuple[str, ...] | None = None
    if request.sharding_type:
        forced = (request.sharding_type,)
    elif resolved["sharding_type"]:
        forced = tuple(str(resolved["sharding_type"]).split(","))
    sweep: list[SweepPoint] = []
    if request.world_size is None:
        # One CPU machine runs every rank unless told otherwise; GPUs come 8 to a host.
        per_host = request.local_world_size or (
            None if topology.device == "cuda" else 1 << 16)
        result = smallest_world_size(tables, topology, batch, global_batch,
                                     sharding_types=forced, ranks_per_host=per_host)
        world = result.topology.world_size
        sizes = [world * f for f in (1, 2, 4, 8)]
        sweep = sweep_world_sizes(tables, result.topology, batch, sizes, global_batch,
                                  sharding_types=forced, ranks_per_host=per_host)
    else:
        per_rank = max(batch // topology.world_size, 1) if global_batch else batch
        result = EmbeddingShardingPlanner(topology, per_rank, forced).plan(tables)
    result.plan.metadata["inputs"] = resolved
    outcome = PlanOutcome(result, tables, sweep, resolved)
    if request.out is not None:
        result.plan.save(request.out)
    if tracker is not None:
        with tracker.run("plan") as run:
            run.log_params(resolved)
            run.log_metrics(summary_metrics(result))
            run.log_dict(outcome.summary, "plan_summary.json")
            if sweep:
                run.log_dict([p.__dict__ for p in sweep], "world_size_sweep.json")
            if request.out is not None:
                run.log_artifact(request.out)
            else:
                run.log_dict(result.plan.to_dict(), "plan.json")
    return outcome


def _collision_config(feature: Any) -> Any:
    from ctrctl.modules.collisions import CollisionConfig

    c = feature.collision
    return CollisionConfig(capacity=feature.num_embeddings, eviction=c.get("eviction", "lfu"),
                           ttl_days=c.get("ttl_days"),
                           admit_min_count=int(c.get("admit_min_count", 1)),
                           shards=int(c.get("shards", 1)))


def collision_state_bytes(manifest: Any) -> int:
    """Bytes of all the managed-collision (zch) remappers of a dataset's tables (over every
    rank together: each part of a remapper lives on the rank of its rows)."""
    return sum(_collision_config(f).state_bytes()
               for f in manifest.sparse if f.mode == "zch" and f.collision)


def with_remappers(tables: list[TableSpec], manifest: Any) -> list[TableSpec]:
    """``tables`` with each zch table's remapper priced: its state per row and its
    training remap's time per id (:data:`~ctrctl.modules.collisions.REMAP_NS_PER_ID`)."""
    from ctrctl.modules.collisions import REMAP_NS_PER_ID

    zch = {f.name: f for f in manifest.sparse if f.mode == "zch" and f.collision}
    return [dataclasses.replace(t, remap_bytes_per_row=_collision_config(zch[t.name])
                                .state_bytes() / zch[t.name].num_embeddings,
                                remap_ns_per_id=REMAP_NS_PER_ID)
            if t.name in zch else t for t in tables]
