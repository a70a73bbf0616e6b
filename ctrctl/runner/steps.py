"""The steps of ``ctrctl run``: what each reads, its settings, what it writes, and the call.

Every step calls the library in process (the commands' own functions) and its outputs are
the next step's inputs, all under one working folder::

    raw/          synth: synthetic logs (optional)
    dataset/      preprocess: Parquet splits + manifest.json
    plan.json     plan
    tune/         tune (with tune.trials > 0): study.db, best.yaml, best/, trials.parquet
    train/        train: checkpoints/, metrics.json, config.json
    index/        index (two-tower pipelines): the item index (:mod:`ctrctl.runner.retrieval_steps`)
    eval/         eval: metrics.json, gates.json, plots
    export/       quantize: the quantized model (and its MLflow pyfunc model in the run)
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrctl.config import PipelineConfig
from ctrctl.errors import CtrctlError
from ctrctl.progress import Progress
from ctrctl.runner import retrieval_steps
from ctrctl.runner.validate import input_paths, quantize_config
from ctrctl.tracking import Tracker

logger = logging.getLogger(__name__)

STEPS: tuple[str, ...] = ("synth", "preprocess", "plan", "tune", "train", "index", "eval",
                          "quantize", "register")


@dataclass
class Context:
    """What the steps share within one run."""

    cfg: PipelineConfig
    workdir: Path
    tracker: Tracker
    progress: Progress
    parent_run_id: str | None = None
    config_file: Path | None = None
    tracking_uri: str | None = None
    #: step -> its summary, this run (filled as steps complete or are skipped).
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def raw(self) -> Path:
        return self.workdir / "raw"

    @property
    def dataset(self) -> Path:
        return self.workdir / "dataset"

    @property
    def plan(self) -> Path:
        return self.workdir / "plan.json"

    @property
    def tune(self) -> Path:
        return self.workdir / "tune"

    @property
    def train(self) -> Path:
        return self.workdir / "train"

    def train_config(self) -> PipelineConfig:
        """The config training uses: the pipeline's, with the tune step's best model,
        optimizer and training settings when that step is on."""
        if not self.cfg.tune.trials:
            return self.cfg
        from ctrctl.config import load_config

        best = load_config(self.tune / "best.yaml")
        return self.cfg.model_copy(update={
            "model": best.model, "embedding_optimizer": best.embedding_optimizer,
            "dense_optimizer": best.dense_optimizer, "training": best.training})

    @property
    def index(self) -> Path:
        return self.workdir / "index"

    @property
    def eval(self) -> Path:
        return self.workdir / "eval"

    @property
    def export(self) -> Path:
        return self.workdir / "export"

    def checkpoint(self) -> Path:
        """The train step's latest checkpoint folder (or where it will be)."""
        from ctrctl.checkpoint import latest_checkpoint

        folder = self.train / "checkpoints"
        latest = latest_checkpoint(folder) if folder.is_dir() else None
        return latest if latest is not None else folder / "missing"


@dataclass(frozen=True)
class Step:
    """One step: its inputs, settings and outputs (for skipping) and the call.

    ``run(ctx, resume)`` returns the step's summary (a key metric first); ``resume`` is
    True when the same step with the same key was interrupted last time.
    ``unavailable(ctx)`` says why the step cannot run at all (None: it can).
    """

    name: str
    inputs: Callable[[Context], dict[str, Path]]
    settings: Callable[[Context], dict[str, Any]]
    outputs: Callable[[Context], dict[str, Path]]
    run: Callable[[Context, bool], dict[str, Any]]
    unavailable: Callable[[Context], str | None] = lambda ctx: None


# ---- synth -----------------------------------------------------------------------------
def _synth(ctx: Context, resume: bool) -> dict[str, Any]:
    from ctrctl.data.synthetic import synthesize

    s = ctx.cfg.synth
    assert s.format is not None
    result = synthesize(ctx.raw, rows=s.rows, format=s.format, seed=s.seed, overwrite=True,
                        progress=ctx.progress, tracker=ctx.tracker)
    return {"rows": result.total_rows, "best_auc.test": result.best_auc.get("test")}


def _synth_files(ctx: Context) -> list[str]:
    ext = "tsv" if ctx.cfg.synth.format == "criteo" else "csv"
    return [f"{split}={ctx.raw / f'{split}.{ext}'}" for split in ("train", "val", "test")]


# ---- preprocess ------------------------------------------------------------------------
def _raw_inputs(ctx: Context) -> list[str]:
    return _synth_files(ctx) if ctx.cfg.synth.format is not None else list(ctx.cfg.data.inputs)


def _preprocess_inputs(ctx: Context) -> dict[str, Path]:
    from ctrctl.data.schema import resolve_schema_path

    assert ctx.cfg.data.schema_path is not None
    paths: dict[str, Path] = {"schema": resolve_schema_path(ctx.cfg.data.schema_path)}
    for split, matches in input_paths(_raw_inputs(ctx)):
        for path in matches:
            paths[f"{split or '-'}={path}"] = path
    if ctx.cfg.data.reuse_transforms:
        paths["follows"] = Path(ctx.cfg.data.reuse_transforms) / "manifest.json"
    return paths


def _preprocess_settings(ctx: Context) -> dict[str, Any]:
    # reuse_transforms only when set, so an unchanged pipeline keeps its key
    settings = ctx.cfg.data.model_dump(mode="json")
    if settings.get("reuse_transforms") is None:
        settings.pop("reuse_transforms", None)
    return settings


def _preprocess(ctx: Context, resume: bool) -> dict[str, Any]:
    from ctrctl.data.preprocess import preprocess
    from ctrctl.data.schema import load_schema
    from ctrctl.data.schema_drift import check_schema_drift

    d = ctx.cfg.data
    assert d.schema_path is not None
    # New logs whose columns or formats changed are named before anything is written.
    check_schema_drift(load_schema(d.schema_path),
                       [p for _, matches in input_paths(_raw_inputs(ctx)) for p in matches],
                       where=str(d.schema_path))
    manifest = preprocess(d.schema_path, _raw_inputs(ctx), ctx.dataset,
                          split_ratio=d.split_ratio, seed=d.split_seed,
                          on_bad_rows=d.on_bad_rows, val_fraction=d.val_fraction,
                          reuse_transforms=d.reuse_transforms, overwrite=True, progress=ctx.progress,
                          tracker=ctx.tracker)
    return {"rows": sum(s.rows for s in manifest.splits.values()),
            **{f"rows.{k}": v.rows for k, v in manifest.splits.items()}}


# ---- plan ------------------------------------------------------------------------------
def _plan_settings(ctx: Context) -> dict[str, Any]:
    c = ctx.cfg
    return {"plan": c.plan.model_dump(mode="json"), "embedding_dim": c.model.embedding_dim,
            "batch_size": c.training.batch_size, "optimizer": c.embedding_optimizer.kind}


def _plan(ctx: Context, resume: bool) -> dict[str, Any]:
    from ctrctl.planning import PlanRequest, run_plan

    resolved = ctx.workdir / ".ctrctl" / "config.yaml"
    outcome = run_plan(PlanRequest(dataset=ctx.dataset, config=resolved,
                                   world_size=ctx.cfg.plan.world_size, out=ctx.plan,
                                   overwrite=True), tracker=ctx.tracker)
    summary = outcome.summary
    return {"world_size": ctx.cfg.plan.world_size,
            **{k: v for k, v in summary.items() if isinstance(v, (int, float, str))}}


# ---- tune ------------------------------------------------------------------------------
def _tune_settings(ctx: Context) -> dict[str, Any]:
    return {"tune": ctx.cfg.tune.model_dump(mode="json"), **_train_settings(ctx, ctx.cfg)}


def _tune(ctx: Context, resume: bool) -> dict[str, Any]:
    from ctrctl.tuning import TuneRequest, tune

    t = ctx.cfg.tune
    assert ctx.config_file is not None
    result = tune(TuneRequest(dataset=ctx.dataset, out=ctx.tune, config=ctx.config_file,
                              trials=t.trials, timeout_s=t.timeout_s, metric=t.metric,
                              space=dict(t.space) or None, seed=t.seed, pruner=t.pruner,
                              finalists=t.finalists, holdouts=t.holdouts,
                              nproc_per_node=ctx.cfg.runner.nproc_per_node),
                  tracker=ctx.tracker)
    if result.best_value is None:
        raise CtrctlError("no tune trial completed", where=str(ctx.tune),
                          hint="raise tune.trials or tune.timeout_s")
    return {"best": result.best_value, "metric": t.metric, "trial": result.best_number,
            **{f"trials.{k.lower()}": v for k, v in result.counts.items()},
            **{f"best.{k}": v for k, v in result.best_params.items()}}


def _no_tune(ctx: Context) -> str | None:
    return None if ctx.cfg.tune.trials else "tune.trials is 0"


# ---- train -----------------------------------------------------------------------------
def _train_settings(ctx: Context, cfg: PipelineConfig | None = None) -> dict[str, Any]:
    c = cfg or ctx.train_config()
    return {"model": c.model.model_dump(mode="json"),
            "embedding_optimizer": c.embedding_optimizer.model_dump(mode="json"),
            "dense_optimizer": c.dense_optimizer.model_dump(mode="json"),
            "training": c.training.model_dump(mode="json"),
            "eval_batch_size": c.eval.batch_size, "nproc_per_node": c.runner.nproc_per_node}


def _train_inputs(ctx: Context) -> dict[str, Path]:
    """The dataset, the plan, a tune step's best settings, and a warm start's parent
    checkpoint (by content: a parent trained again reruns the step; a ``models:/`` parent
    is known by its URI only)."""
    paths = {"dataset": ctx.dataset, "plan": ctx.plan}
    if ctx.cfg.tune.trials:
        paths["tuned"] = ctx.tune / "best.yaml"
    parent = ctx.cfg.training.init_from
    if parent and not parent.startswith("models:/"):
        from ctrctl.checkpoint import resolve_checkpoint

        paths["parent"] = resolve_checkpoint(parent)
    return paths


def _train(ctx: Context, resume: bool) -> dict[str, Any]:
    nproc = ctx.cfg.runner.nproc_per_node
    if resume:
        logger.info("train: resuming from the last checkpoint in %s", ctx.train)
    cfg = ctx.train_config()
    if nproc == 1:
        from ctrctl.training.loop import train

        result = train(ctx.dataset, ctx.train, cfg, resume=resume, overwrite=not resume,
                       tracker=ctx.tracker, progress=ctx.progress)
        metrics = dict(result.metrics)
        step = result.step
    else:
        from ctrctl.tracking import PARENT_RUN_ENV
        from ctrctl.training.launch import TrainSpec, launch_training

        config = ctx.workdir / ".ctrctl" / "config.yaml"
        plan: str | None = str(ctx.plan)
        if cfg is not ctx.cfg:  # tuned: the plan was made for the pipeline's own shapes
            from ctrctl.config import dump_config
            from ctrctl.io import write_text_atomic

            config, plan = ctx.workdir / ".ctrctl" / "train-config.yaml", None
            write_text_atomic(config, dump_config(cfg))
        spec = TrainSpec(dataset=str(ctx.dataset), out=str(ctx.train),
                         config=str(config), resume=resume,
                         overwrite=not resume, plan=plan,
                         track=ctx.tracker.enabled, tracking_uri=ctx.tracking_uri,
                         experiment=getattr(ctx.tracker, "experiment", "ctrctl"),
                         env={PARENT_RUN_ENV: ctx.parent_run_id} if ctx.parent_run_id else {})
        launch_training(spec, nproc)  # a failed rank raises, naming it
        data = json.loads((ctx.train / "metrics.json").read_text())
        metrics, step = dict(data.get("metrics", {})), int(data.get("step", 0))
    return {"val.auc": metrics.get("val.auc"), "step": step,
            **{k: v for k, v in metrics.items() if isinstance(v, (int, float))}}


# ---- eval ------------------------------------------------------------------------------
def gate_texts(cfg: PipelineConfig) -> list[str]:
    """The pipeline's gates as ``metric>=bound`` strings."""
    from ctrctl.evaluation.gates import gates_from_mapping

    return [str(g) for g in gates_from_mapping(cfg.eval.gates)]


def _eval(ctx: Context, resume: bool) -> dict[str, Any]:
    from ctrctl.evaluation.evaluate import evaluate
    from ctrctl.evaluation.gates import gates_from_mapping

    if retrieval_steps.is_two_tower(ctx.cfg):
        return retrieval_steps.run_retrieval_eval(ctx)

    result = evaluate(ctx.eval, checkpoint=ctx.train, dataset=ctx.dataset,
                      split=ctx.cfg.runner.eval_split,
                      gates=gates_from_mapping(ctx.cfg.eval.gates), overwrite=True,
                      batch_size=ctx.cfg.eval.batch_size, tracker=ctx.tracker,
                      progress=ctx.progress, gates_raise=False)
    metrics = {k: v for k, v in result.metrics.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {"auc": metrics.get("auc"), **metrics, "gates_passed": result.passed,
            "gates": [g.describe() for g in result.gates]}


# ---- quantize --------------------------------------------------------------------------
def _no_quantize(ctx: Context) -> str | None:
    if not ctx.cfg.quantize.enabled:
        return "quantize.enabled is false"
    return None


def quantize_settings(cfg: PipelineConfig) -> dict[str, Any]:
    """The quantize section as the step's key and lineage record it (the keys added later,
    per_table, device_memory_bytes and request_size, only when set, so an unchanged
    pipeline keeps its key)."""
    q = cfg.quantize
    settings: dict[str, Any] = {"dtype": q.dtype, "dense_dtype": q.dense_dtype,
                                "num_shards": q.num_shards}
    if q.per_table:
        settings["per_table"] = dict(q.per_table)
    if q.device_memory_bytes is not None:
        settings["device_memory_bytes"] = q.device_memory_bytes
    if q.request_size is not None:
        settings["request_size"] = q.request_size
    return settings


def _quantize(ctx: Context, resume: bool) -> dict[str, Any]:
    from ctrctl.inference.export import quantize_to_artifact

    if retrieval_steps.is_two_tower(ctx.cfg):
        return retrieval_steps.run_retrieval_export(ctx)
    config = quantize_config(ctx.cfg)
    quantized = quantize_to_artifact(ctx.train, ctx.export, config, dataset=ctx.dataset,
                                     overwrite=True, tracker=ctx.tracker,
                                     log_model=ctx.tracker.enabled)
    return {"bytes.ratio": quantized.quantized_bytes / max(quantized.fp32_bytes, 1),
            "bytes.quantized": quantized.quantized_bytes,
            **({"model_uri": quantized.model_uri} if quantized.model_uri else {})}


# ---- register --------------------------------------------------------------------------
def _no_register(ctx: Context) -> str | None:
    if ctx.cfg.register.model_name is None:
        return "register.model_name is not set"
    if not ctx.tracker.enabled:
        return "tracking is off"
    return _no_quantize(ctx)


def _register(ctx: Context, resume: bool) -> dict[str, Any]:
    from ctrctl.runner.lineage import register

    return register(ctx)


def _eval_inputs(ctx: Context) -> dict[str, Path]:
    """The dataset and the checkpoint, and a two-tower pipeline's index."""
    paths = {"dataset": ctx.dataset, "checkpoint": ctx.checkpoint()}
    if retrieval_steps.is_two_tower(ctx.cfg):
        paths["index"] = ctx.index
    return paths


def _paths(**paths: Callable[[Context], Path]) -> Callable[[Context], dict[str, Path]]:
    return lambda ctx: {label: fn(ctx) for label, fn in paths.items()}


def _none(ctx: Context) -> dict[str, Path]:
    return {}


def steps() -> list[Step]:
    """The steps in order."""
    return [
        Step("synth", _none, lambda c: c.cfg.synth.model_dump(mode="json"),
             _paths(raw=lambda c: c.raw), _synth,
             lambda c: None if c.cfg.synth.format else "no synth.format"),
        Step("preprocess", _preprocess_inputs, _preprocess_settings,
             _paths(dataset=lambda c: c.dataset), _preprocess),
        Step("plan", _paths(manifest=lambda c: c.dataset / "manifest.json"), _plan_settings,
             _paths(plan=lambda c: c.plan), _plan),
        Step("tune", _paths(dataset=lambda c: c.dataset), _tune_settings,
             _paths(best=lambda c: c.tune / "best.yaml"), _tune, _no_tune),
        Step("train", _train_inputs, _train_settings, _paths(checkpoint=Context.checkpoint),
             _train),
        Step("index", _paths(dataset=lambda c: c.dataset, checkpoint=Context.checkpoint),
             retrieval_steps.index_settings, _paths(index=lambda c: c.index),
             retrieval_steps.run_index, retrieval_steps.no_index),
        Step("eval", _eval_inputs,
             lambda c: {"eval": c.cfg.eval.model_dump(mode="json"),
                        "split": c.cfg.runner.eval_split},
             _paths(eval=lambda c: c.eval), _eval),
        Step("quantize", _eval_inputs,
             lambda c: quantize_settings(c.cfg), _paths(export=lambda c: c.export), _quantize,
             _no_quantize),
        Step("register", _paths(export=lambda c: c.export, eval=lambda c: c.eval),
             lambda c: {**c.cfg.register.model_dump(mode="json"),
                        "tracking_uri": c.tracking_uri,
                        "experiment": getattr(c.tracker, "experiment", None)},
             _none, _register, _no_register),
    ]


def check_step_name(name: str | None, option: str) -> None:
    """Refuse an unknown ``--from``/``--until`` step."""
    if name is not None and name not in STEPS:
        raise CtrctlError(f"unknown step {name!r} for {option}",
                          hint=f"use one of {', '.join(STEPS)}")
