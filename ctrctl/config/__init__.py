"""Pipeline configs: a YAML file, typed by pydantic, with ``key=value`` overrides, then frozen.

A pipeline YAML has one section per step; every section and key is declared here, so a
misspelt key is an error naming the key and the file (``extra="forbid"``), not a silently
ignored setting. Overrides from the command line are dotted paths into the same tree and are
type-checked the same way::

    training.batch_size=1024  model.dense_arch=[64,32,16]  dense_optimizer.kind=adam

Values of overrides are parsed as YAML scalars/lists (``1e-3``, ``true``, ``[1,2]``).

Example:
    >>> cfg = load_config("pipelines/default.yaml", ["training.epochs=2"])
    >>> cfg.training.epochs
    2
    >>> cfg.model.embedding_dim
    16
"""

from __future__ import annotations

from ctrctl.config.loading import (
    ADDED_SINCE,
    REMOVED_KEYS,
    apply_overrides,
    as_saved_before,
    defaults_path,
    dump_config,
    flat_keys,
    key_location,
    load_config,
    parse_config,
)
from ctrctl.config.schedule import PromoteConfig, ScheduleConfig, ScheduleSynthConfig
from ctrctl.config.sections import (
    DEFAULT_VAL_FRACTION,
    DataConfig,
    DenseOptimizerConfig,
    EarlyStoppingConfig,
    EmbeddingOptimizerSection,
    EvalConfig,
    IndexStepConfig,
    ModelConfig,
    PipelineConfig,
    PlanConfig,
    PreprocessConfig,
    QuantizeStepConfig,
    RegisterConfig,
    RunnerConfig,
    SynthConfig,
    TableConstraintConfig,
    TrainingConfig,
    TuneStepConfig,
)

__all__ = [
    "ADDED_SINCE",
    "DEFAULT_VAL_FRACTION",
    "REMOVED_KEYS",
    "DataConfig",
    "DenseOptimizerConfig",
    "EarlyStoppingConfig",
    "EmbeddingOptimizerSection",
    "EvalConfig",
    "IndexStepConfig",
    "ModelConfig",
    "PipelineConfig",
    "PlanConfig",
    "PreprocessConfig",
    "PromoteConfig",
    "QuantizeStepConfig",
    "RegisterConfig",
    "RunnerConfig",
    "ScheduleConfig",
    "ScheduleSynthConfig",
    "SynthConfig",
    "TableConstraintConfig",
    "TrainingConfig",
    "TuneStepConfig",
    "apply_overrides",
    "as_saved_before",
    "defaults_path",
    "dump_config",
    "flat_keys",
    "key_location",
    "load_config",
    "parse_config",
]
