"""The sections of a pipeline YAML, one pydantic model per step, and the whole
:class:`PipelineConfig`. Loading, overrides and error locations are in
:mod:`ctrctl.config.loading`; import both from :mod:`ctrctl.config`."""

from __future__ import annotations

import warnings
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ctrctl.config.base import PathName, Section
from ctrctl.config.model_section import ModelConfig
from ctrctl.config.schedule import ScheduleConfig
from ctrctl.names import ComputeKernel, ShardingType

__all__ = [
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
    "QuantizeStepConfig",
    "RegisterConfig",
    "RunnerConfig",
    "SynthConfig",
    "TableConstraintConfig",
    "TrainingConfig",
    "TuneStepConfig",
]


# ---- optimizers --------------------------------------------------------------------------
class EmbeddingOptimizerSection(Section):
    """The ``embedding_optimizer:`` section of a pipeline YAML: the fused optimizer as a user
    writes it.

    The kernels take :class:`ctrctl.modules.optimizers.EmbeddingOptimizerConfig` (FBGEMM's
    names: ``exact_rowwise_adagrad`` ...); ``ctrctl.training.optimizers.embedding_optimizer``
    turns this section into one.

    Attributes:
        kind: ``rowwise_adagrad`` (one accumulator per row), ``adagrad`` (one per element) or
            ``sgd``; these are the ones FBGEMM's CPU kernels fuse.
        lr: learning rate.
        eps: added to the accumulator's square root (adagrad kinds).
        weight_decay: L2 penalty added to the gradient.
    """

    kind: Literal["rowwise_adagrad", "adagrad", "sgd"] = "rowwise_adagrad"
    lr: float = Field(default=0.05, gt=0)
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)


class DenseOptimizerConfig(Section):
    """The optimizer of the MLPs and interaction layers (a torch.optim optimizer).

    Attributes:
        kind: ``adagrad``, ``adam`` or ``sgd``.
        lr: learning rate.
        eps: numerical epsilon (adagrad, adam).
        weight_decay: L2 penalty.
        momentum: SGD momentum (ignored by the others).
    """

    kind: Literal["adagrad", "adam", "sgd"] = "adagrad"
    lr: float = Field(default=0.01, gt=0)
    eps: float = Field(default=1e-8, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    momentum: float = Field(default=0.0, ge=0)


# ---- training ----------------------------------------------------------------------------
class EarlyStoppingConfig(Section):
    """Stop when the validation metric stops improving, and end with the best weights.

    On whenever the dataset has the validation split (``training.val_split``) and
    ``enabled`` is true; the run validates every ``training.val_every`` steps, keeps the best
    weights in ``OUT/best/`` and, when it stops (patience spent or the ``epochs`` /
    ``max_steps`` cap reached), puts them back into the model before the final checkpoint.

    Attributes:
        enabled: use early stopping when a validation split exists.
        metric: the validation metric watched (``logloss`` or ``auc``; a two-tower model:
            ``recall@10``, ``recall@50`` or ``recall@100``).
        mode: ``min`` (logloss) or ``max`` (auc); ``auto`` picks by the metric.
        patience: validations without improvement before stopping.
        min_delta: an improvement smaller than this does not count.
        restore_best: end the run with the best validation's weights.
    """

    enabled: bool = True
    metric: Literal["logloss", "auc", "recall@10", "recall@50", "recall@100"] = "logloss"
    mode: Literal["auto", "min", "max"] = "auto"
    patience: int = Field(default=3, ge=1)
    min_delta: float = Field(default=0.0, ge=0)
    restore_best: bool = True

    @property
    def direction(self) -> str:
        """``min`` or ``max``: ``auto`` resolved by the metric."""
        if self.mode != "auto":
            return self.mode
        return "min" if self.metric == "logloss" else "max"


class TrainingConfig(Section):
    """The train loop.

    Sizes left at ``null`` follow from the training split's row count (see
    :func:`ctrctl.training.sizes.resolve_sizes`): small data gets small batches and several
    epochs, large data keeps large batches; what was chosen is logged before training.

    Attributes:
        batch_size: the global batch: over W ranks each rank takes ``batch_size / W`` rows
            per step, so it must divide evenly (null: from the row count).
        epochs: the most passes over the training split (null: from the row count); early
            stopping may end the run sooner. Ignored when ``max_steps`` is set.
        max_steps: stop after this many steps, crossing epochs as needed.
        val_every: validate every N steps (null: four times an epoch but at most every 25
            steps, so once an epoch for short ones, and at least four times a run; 0: only
            at the end).
        checkpoint_every: write a checkpoint every N steps (0: only at the end).
        keep_checkpoints: periodic checkpoints kept (older ones are removed; 0: keep all).
        log_checkpoint: also copy the final checkpoint into the MLflow run's artifacts
            (under ``model/``); off by default, as a checkpoint can be hundreds of MB and
            stays in ``--out`` anyway.
        log_every: log metrics (MLflow, progress) every N steps.
        seed: seeds parameter initialisation, shuffling and every RNG.
        num_workers: loader threads reading Parquet row groups.
        shuffle_buffer: rows shuffled together (whole row groups are gathered up to this).
        drop_last: drop the last partial batch of an epoch.
        device: ``auto`` (cuda when present), ``cpu`` or ``cuda``.
        bf16: run the dense MLPs and the interaction under bfloat16 autocast (fp32 master
            weights, fp32 embeddings) on CUDA or a CPU with AMX-BF16 / AVX512-BF16; on
            other CPUs it is ignored with a warning (emulated bf16 is slower than fp32).
        val_split: the split validated on.
        val_max_rows: cap on validation rows (None: the whole split).
        global_order: every rank reads the split in the one-process order and takes its
            slice of each global batch: W processes train on exactly the batches of one
            process, at W times the reading cost.
        early_stopping: see :class:`EarlyStoppingConfig`.
        pipeline: the train pipeline (:mod:`ctrctl.distributed.pipeline`): ``auto`` (the
            fastest exact one: ``prefetch`` when a table is cached, else ``sparse-dist``),
            ``base`` (the plain loop), ``sparse-dist`` (loading and the ids' all-to-all
            overlap compute), ``prefetch`` (also cached tables' rows one batch ahead) or
            ``semi-sync`` (embedding lookups one step ahead, on weights one step older:
            changes the numerics).
        semi_sync_start_step: ``semi-sync`` runs synchronously before this step.
        dedup: deduplicated lookups in sharded tables (:mod:`ctrctl.sparse.dedup`): ``on``
            (every feature's repeated bags of a batch looked up and sent once), ``off``, or
            ``auto`` (on for a batch whose distinct-bag share is below the measured
            threshold, 0.35; see docs/dedup.md). Losses match ``off`` to rounding.
        trace: write a Chrome trace of the pipeline's stages (per step, per thread) here.
        init_from: warm start: a checkpoint (step, ``checkpoints`` or output folder) or a
            registered ``models:/NAME@ALIAS`` whose weights and optimizer state the run
            starts from (:mod:`ctrctl.training.warm_start`); steps and schedule start fresh.
    """

    batch_size: int | None = Field(default=None, gt=0)
    epochs: int | None = Field(default=None, ge=1)
    max_steps: int | None = Field(default=None, ge=1)
    val_every: int | None = Field(default=None, ge=0)
    checkpoint_every: int = Field(default=0, ge=0)
    keep_checkpoints: int = Field(default=2, ge=0)
    log_checkpoint: bool = False
    log_every: int = Field(default=50, ge=1)
    seed: int = 0
    num_workers: int = Field(default=2, ge=0)
    shuffle_buffer: int = Field(default=262_144, ge=1)
    drop_last: bool = False
    device: Literal["auto", "cpu", "cuda"] = "auto"
    bf16: bool = False
    val_split: PathName = "val"
    val_max_rows: int | None = Field(default=None, ge=1)
    global_order: bool = False
    early_stopping: EarlyStoppingConfig = EarlyStoppingConfig()
    pipeline: Literal["auto", "base", "sparse-dist", "semi-sync", "prefetch"] = "auto"
    semi_sync_start_step: int = Field(default=100, ge=0)
    dedup: Literal["auto", "on", "off"] = "off"
    trace: str | None = None
    init_from: str | None = None

    @field_validator("dedup", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: object) -> object:
        # YAML reads a bare on/off as a boolean: take it as the word that was written
        if isinstance(value, bool):
            return "on" if value else "off"
        return value


# ---- sections of the other steps -----------------------------------------------------------
class PreprocessConfig(Section):
    """What a pipeline says about its dataset.

    Attributes:
        out: the dataset folder (``ctrctl plan --config F`` plans for it when no --dataset
            is given).
    """

    out: str | None = None


class TableConstraintConfig(Section):
    """What the planner may do with one table (every key optional; absent: no limit).

    Attributes:
        sharding_types: allowed sharding types (``row_wise``, ``table_wise`` ...).
        compute_kernels: allowed compute kernels (``fused``, ``fused_uvm_caching`` ...).
        min_col_block: narrowest column block for column-wise sharding.
        ranks: the only ranks that may hold the table's shards.
        cache_load_factor: fraction of rows a ``fused_uvm_caching`` table keeps on device (a
            ``fused_cached`` one in DRAM, CPU).

    Example:
        >>> TableConstraintConfig.model_validate({"sharding_types": ["row_wise"]}).ranks
    """

    sharding_types: tuple[str, ...] | None = None
    compute_kernels: tuple[str, ...] | None = None
    min_col_block: int | None = Field(default=None, gt=0)
    ranks: tuple[int, ...] | None = None
    cache_load_factor: float | None = Field(default=None, gt=0, le=1)

    @model_validator(mode="after")
    def _check_names(self) -> TableConstraintConfig:
        for key, values, known in (
                ("sharding_types", self.sharding_types, [t.value for t in ShardingType]),
                ("compute_kernels", self.compute_kernels, [k.value for k in ComputeKernel])):
            unknown = sorted(set(values or ()) - set(known))
            if unknown:
                raise ValueError(f"unknown {key} {unknown}; use some of {known}")
        if any(rank < 0 for rank in self.ranks or ()):
            raise ValueError(f"ranks must be >= 0, got {list(self.ranks or ())}")
        return self

    def as_dict(self) -> dict[str, Any]:
        """The keys that were set, as plain values (what the planner's tables take)."""
        return self.model_dump(mode="json", exclude_none=True)


class PlanConfig(Section):
    """``ctrctl plan`` settings a pipeline can carry.

    Attributes:
        world_size: ranks to plan for.
        local_world_size: ranks per host (default: all on one host).
        device: ``cpu`` or ``cuda`` topology.
        sharding_types: allowed sharding types (empty: all).
        constraints: per-table limits by table name (the sparse feature's name for a
            dataset), e.g. ``{C1: {sharding_types: [row_wise], ranks: [0, 1]}}``; a name
            that is not a table is an error when planning.
    """

    world_size: int = Field(default=1, ge=1)
    local_world_size: int | None = Field(default=None, ge=1)
    device: Literal["cpu", "cuda"] = "cpu"
    sharding_types: tuple[str, ...] = ()
    constraints: dict[str, TableConstraintConfig] = dict()


class EvalConfig(Section):
    """``ctrctl eval`` / validation settings a pipeline can carry.

    Attributes:
        batch_size: rows per scoring batch (per rank), in training's validation.
        gates: metric -> bound that ``ctrctl eval --config F`` checks when no --gate is
            given: a number is "at least" for higher-is-better metrics (``auc: 0.70``) and
            "at most" for lower-is-better ones (``logloss: 0.5``); a string is the rest of
            a gate (``calibration: "=1.0+-0.05"``).
    """

    batch_size: int = Field(default=8192, gt=0)
    gates: dict[str, float | str] = dict()


# ---- sections only ``ctrctl run`` reads ------------------------------------------------------
#: Share of the training rows carved into a val split when no val input is given: the one
#: default of ``preprocess()``, ``ctrctl preprocess --val-fraction`` and ``data.val_fraction``.
DEFAULT_VAL_FRACTION = 0.1


class DataConfig(Section):
    """The raw logs a pipeline starts from and how they are read (``ctrctl run``).

    Attributes:
        schema_path: the feature schema YAML (``schemas/criteo.yaml``); relative paths are
            taken from the folder ``ctrctl run`` is started in.
        inputs: ``[SPLIT=]PATH`` items (globs allowed), as ``ctrctl preprocess --input``;
            empty when ``synth`` makes the logs.
        split_ratio: ``"train,val,test"`` fractions for inputs without a split.
        split_seed: seed of that random split.
        on_bad_rows: ``error`` or ``skip``.
        val_fraction: with no ``val`` input (and no ``split_ratio``), this share of the
            training rows (random, ``split_seed``) becomes the val split training stops
            early on; 0: none.
        reuse_transforms: a dataset folder whose vocabularies and hash sizes to apply
            (``ctrctl preprocess --reuse-transforms``; a schedule sets it to its first day
            when that has vocabulary features).
    """

    schema_path: str | None = None
    inputs: tuple[str, ...] = ()
    split_ratio: str | None = None
    split_seed: int = 0
    on_bad_rows: Literal["error", "skip"] = "error"
    val_fraction: float = Field(default=DEFAULT_VAL_FRACTION, ge=0.0, lt=1.0)
    reuse_transforms: str | None = None


class SynthConfig(Section):
    """The optional first step of ``ctrctl run``: synthetic raw logs (demos, CI).

    Attributes:
        format: ``criteo`` or ``avazu``; None (the default) runs no synth step and the
            pipeline reads ``preprocess.inputs`` instead.
        rows: rows over all splits (80% train, 10% val, 10% test).
        seed: the same seed gives the same bytes.
    """

    format: Literal["criteo", "avazu"] | None = None
    rows: int = Field(default=200_000, ge=10)
    seed: int = 0


class QuantizeStepConfig(Section):
    """``ctrctl quantize`` settings a pipeline can carry.

    Attributes:
        enabled: run the quantize step (and so the registration of its model).
        dtype: the type of the embedding tables (``int8``, ``int4``, ``fp16`` ...).
        per_table: table -> type, for tables that differ from ``dtype``.
        dense_dtype: the type of the dense layers (``fp32``, ``bf16``, ``int8``).
        num_shards: serving shards the tables are placed on.
        device_memory_bytes: table memory per serving shard (unset: unlimited).
        request_size: candidates per request, for the placement's costs (unset: the
            quantizer's default).
    """

    enabled: bool = True
    dtype: str = "int8"
    per_table: dict[str, str] = Field(default_factory=dict)
    dense_dtype: str = "fp32"
    num_shards: int = Field(default=1, ge=1)
    device_memory_bytes: int | None = Field(default=None, ge=1)
    request_size: int | None = Field(default=None, ge=1)


class IndexStepConfig(Section):
    """The item index ``ctrctl run`` builds for a two-tower model (``ctrctl index``).

    Attributes:
        kind: ``flat`` (exact), ``sq8`` (INT8 codes), ``ivf``, ``hnsw`` or ``ivfpq`` (PQ
            codes); see :mod:`ctrctl.retrieval.index`.
        params: parameters over the defaults that fit the item count (``nlist``,
            ``nprobe``, ``M``, ``efSearch``, ...).
        k: the cut-off of the index's recall against exact search.
    """

    kind: Literal["flat", "sq8", "ivf", "hnsw", "ivfpq"] = "hnsw"
    params: dict[str, int] = Field(default_factory=dict)
    k: int = Field(default=100, ge=1)


class RegisterConfig(Section):
    """Where ``ctrctl run`` registers the quantized model.

    Attributes:
        model_name: the registered model's name; None registers nothing.
        alias: moved to the new version only when every eval gate passed.
        champion_metric: ``auc`` or ``logloss``: a version that passed the gates is
            compared with the one ``champion_alias`` names, both exports scoring the same
            eval rows in this run (:mod:`ctrctl.runner.promotion`); None: no champion.
        champion_alias: moved only when the new version beats the champion by more than
            ``min_gain`` (in ``champion_metric``; the first version to pass takes it).
        min_gain: the gain that counts as real.
    """

    model_name: PathName | None = None
    alias: str = Field(default="candidate", min_length=1)
    champion_metric: Literal["auc", "logloss"] | None = None
    champion_alias: str = Field(default="champion", min_length=1)
    min_gain: float = Field(default=0.0, ge=0.0)


class TuneStepConfig(Section):
    """The optional tune step of ``ctrctl run``: a search before training (``ctrctl tune``).

    With ``trials`` above 0 the run searches on the val split (into ``WORKDIR/tune``) and
    the train step trains the best trial's model, training and optimizer settings.

    Attributes:
        trials: finished trials to run (0: no tune step).
        timeout_s: start no trial after this many seconds (null: no limit).
        metric: ``val.logloss`` or ``val.auc``.
        space: pipeline key -> ``{low, high, log}`` or ``{choices: [...]}`` (empty: the
            built-in space; see ``ctrctl tune --space``).
        seed: the sampler's seed.
        pruner: ``median``, ``halving`` or ``none``.
        finalists: the best completed trials trained again on fresh val samples after the
            search, beside the defaults' trial (0: the search's val winner is kept).
        holdouts: the fresh val samples (drawn from train) each finalist is trained on.
    """

    trials: int = Field(default=0, ge=0)
    timeout_s: float | None = Field(default=None, gt=0)
    metric: Literal["val.logloss", "val.auc"] = "val.logloss"
    space: dict[str, dict[str, Any]] = Field(default_factory=dict)
    seed: int = 0
    pruner: Literal["median", "halving", "none"] = "median"
    finalists: int = Field(default=3, ge=0)
    holdouts: int = Field(default=2, ge=0)


class RunnerConfig(Section):
    """How ``ctrctl run`` executes the steps.

    Attributes:
        workdir: the working folder of the run (the command line's ``--workdir`` wins;
            default ``runs/<name>``).
        nproc_per_node: training processes (gloo on CPU); the plan's world size must not
            exceed it.
        eval_split: the dataset split the eval step scores (and its gates are checked on).
    """

    workdir: str | None = None
    eval_split: PathName = "test"
    nproc_per_node: int = Field(default=1, ge=1)


# ---- the whole pipeline --------------------------------------------------------------------
# The YAML section ``register:`` shadows the ``register`` classmethod pydantic models inherit
# from ABCMeta (virtual subclasses), which nothing here calls: pydantic's warning about it is
# silenced for this one class, so that it is not printed on every import.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message='Field name "register"', category=UserWarning)

    class PipelineConfig(Section):
        """One pipeline YAML: every section optional, defaults where absent.

        Attributes:
            name: the pipeline's name: the MLflow parent run is ``run NAME``, tagged
                ``ctrctl.pipeline``, and the default work folder is ``runs/NAME``, so it must
                be usable as a file name.
            description: free text for the reader of the YAML; ctrctl does not use it.

        Example:
            >>> PipelineConfig.model_validate({"training": {"epochs": 3}}).training.epochs
            3
        """

        name: PathName = "default"
        description: str = ""
        preprocess: PreprocessConfig = PreprocessConfig()
        plan: PlanConfig = PlanConfig()
        model: ModelConfig = ModelConfig()
        embedding_optimizer: EmbeddingOptimizerSection = EmbeddingOptimizerSection()
        dense_optimizer: DenseOptimizerConfig = DenseOptimizerConfig()
        training: TrainingConfig = TrainingConfig()
        eval: EvalConfig = EvalConfig()
        data: DataConfig = DataConfig()
        synth: SynthConfig = SynthConfig()
        index: IndexStepConfig = IndexStepConfig()
        quantize: QuantizeStepConfig = QuantizeStepConfig()
        register: RegisterConfig = RegisterConfig()
        tune: TuneStepConfig = TuneStepConfig()
        runner: RunnerConfig = RunnerConfig()
        schedule: ScheduleConfig = ScheduleConfig()

        def to_dict(self) -> dict[str, Any]:
            """The resolved config as plain JSON-friendly data (what MLflow and checkpoints keep)."""
            return self.model_dump(mode="json")
