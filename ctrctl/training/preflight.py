"""What ``ctrctl train`` checks before it starts any work (or any worker process).

A multi-process run found a bad plan or an existing output only after torchrun had started
every worker, and reported it inside torchrun's traceback. Everything that can be known
from the files alone is checked here, in the launching process, as one clear error.

Example:
    >>> plan = preflight("dataset", "runs/a", cfg, Path("plan.json"), world_size=2)
"""

from __future__ import annotations

import logging
from pathlib import Path

from ctrctl.checkpoint import latest_checkpoint
from ctrctl.config import PipelineConfig
from ctrctl.data.manifest import DatasetManifest
from ctrctl.distributed.types import ShardingPlan, ShardingType
from ctrctl.errors import ConfigError, OutputExistsError

logger = logging.getLogger(__name__)


def model_tables(manifest: DatasetManifest, config: PipelineConfig) -> dict[str, tuple[int, int]]:
    """Table name -> (rows, dim) of the DLRM ``build_model`` makes for this dataset."""
    return {name: (rows, config.model.embedding_dim)
            for name, rows in manifest.table_sizes().items()}


def preflight(dataset: str | Path, out: str | Path, config: PipelineConfig,
              plan: str | Path | None, world_size: int, resume: bool = False,
              overwrite: bool = False) -> ShardingPlan | None:
    """Check a training run's inputs and output before anything starts.

    Args:
        dataset: the dataset folder (its manifest must load).
        out: the run folder (holding checkpoints needs ``resume`` or ``overwrite``).
        config: the resolved config.
        plan: a plan.json, validated against the model's tables for ``world_size`` ranks;
            with one process it is validated against its own world size and not used.
        world_size: the processes that will train.

    Returns:
        The loaded plan, or None (no plan, or one process).

    Raises:
        DatasetError, FormatError, PlanError, OutputExistsError.
    """
    manifest = DatasetManifest.load(dataset)
    checkpoints = Path(out) / "checkpoints"
    existing = latest_checkpoint(checkpoints) if checkpoints.is_dir() else None
    if existing is not None and not resume and not overwrite:
        raise OutputExistsError("the output folder already holds checkpoints", where=str(out),
                                hint="pass --resume to continue or --overwrite to start over")
    if plan is None:
        return None
    loaded = ShardingPlan.load(plan)
    tables = model_tables(manifest, config)
    if world_size == 1:
        loaded.validate(tables, where=str(plan))
        logger.warning("%s: one process trains the tables unsharded; the plan (for %d ranks) "
                       "is checked but not used", plan, loaded.world_size)
        return None
    loaded.validate(tables, world_size, where=str(plan))
    replicated = sorted(name for name, sharding in loaded.tables.items()
                        if sharding.sharding_type == ShardingType.DATA_PARALLEL.value)
    if config.training.pipeline == "semi-sync" and replicated:  # as the pipeline says, later
        raise ConfigError(
            f"semi-sync looks embeddings up one step ahead, which data-parallel tables "
            f"({', '.join(replicated)}) cannot do: the dense optimizer steps them",
            where=f"training.pipeline and {plan}", hint="plan them on another sharding type, "
            "or use the sparse-dist pipeline")
    return loaded
