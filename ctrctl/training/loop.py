"""The train loop: batches -> DLRM -> BCE loss -> fused embedding update + dense optimizer step.

One loop for one process and for many: under ``torch.distributed`` (started by torchrun, see
:mod:`ctrctl.training.launch`) the loop takes its rank and world size from the default process
group, the loader gives each rank its slice (``batch_size / world_size`` rows per step), the
model is wrapped by :func:`ctrctl.models.build.wrap_model`, and only rank 0 logs, tracks and
writes shared files.

What a step is: one batch per rank, one dense optimizer step; the embedding update happens
inside backward (the fused optimizer). Steps count from 0; the loader position saved with a
checkpoint is the next batch to read, so ``--resume`` continues with exactly the batches and
RNG draws an uninterrupted run would have seen: on CPU in one process the results are
bitwise equal.

Example:
    >>> cfg = load_config("pipelines/small.yaml", ["training.max_steps=100"])
    >>> result = train("dataset", "runs/a", cfg)
    >>> result.metrics["val.auc"]
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ctrctl import checkpoint as ckpt
from ctrctl.compat import bf16_autocast_supported
from ctrctl.config import PipelineConfig
from ctrctl.data.dataset import BatchLoader, LoaderPosition
from ctrctl.data.manifest import DatasetManifest
from ctrctl.distributed import checkpoint as dist_ckpt
from ctrctl.distributed import comm
from ctrctl.distributed.embeddingbag import set_dedup
from ctrctl.distributed.pipeline import (
    Tracer,
    TrainPipeline,
    choose_pipeline,
    make_pipeline,
    write_trace,
)
from ctrctl.distributed.types import ShardingPlan
from ctrctl.errors import CheckpointError, ConfigError, OutputExistsError
from ctrctl.io import check_output_location, write_json_atomic, writing
from ctrctl.models import build as model_io
from ctrctl.modules import native
from ctrctl.progress import Progress, format_value
from ctrctl.tracking import Run, Tracker
from ctrctl.training.cache_report import format_cache_report, gather_cache_metrics
from ctrctl.training.collision_report import collision_metrics, format_collision_report
from ctrctl.training.early_stopping import EarlyStopping
from ctrctl.training.objectives import objective_for
from ctrctl.training.optimizers import dense_optimizer
from ctrctl.training.result import TrainResult
from ctrctl.training.runtime import global_sum, resolve_device, world
from ctrctl.training.sizes import FEW_STEPS, resolve_sizes
from ctrctl.training.validation import evaluate_model
from ctrctl.training.warm_start import resolve_parent, warm_start

__all__ = ["TrainResult", "evaluate_model", "resolve_device", "train"]

logger = logging.getLogger(__name__)
#: Told each validation's (step, metrics); returns True to stop the run (a search's pruner).
OnValidation = Callable[[int, dict[str, float]], bool]

#: The folder under OUT holding the best validation's checkpoint.
BEST = "best"


class _Trainer:
    """The loop's state and steps; :func:`train` is its public face."""

    def __init__(self, dataset: Path, out: Path, config: PipelineConfig,
                 plan: ShardingPlan | None, tracker_run: Run, progress: Progress,
                 stop_after: int | None, on_validation: OnValidation | None = None) -> None:
        self.dataset, self.out, self.config = dataset, out, config
        self.t = config.training
        self.run, self.progress = tracker_run, progress
        self.rank, self.world_size = world()
        self.device = resolve_device(self.t.device)
        self.manifest = DatasetManifest.load(dataset)
        #: ``model.interaction`` for this dataset (``auto`` resolved)
        self.interaction = config.model.resolved_interaction(len(self.manifest.dense),
                                                             len(self.manifest.sparse))
        self.plan = plan
        self.stop_after, self.on_validation = stop_after, on_validation

        torch.manual_seed(self.t.seed)
        self.model = model_io.build_model(config, self.manifest, self.device)
        self.pipeline_name = choose_pipeline(self.t.pipeline, self.model)
        if self.world_size > 1:
            # semi-sync's embedding worker runs collectives beside DDP's: give DDP its own group
            dense_group = comm.new_group(list(range(self.world_size))) \
                if self.pipeline_name == "semi-sync" else None
            self.model = model_io.wrap_model(self.model, plan, None, dense_group)
            set_dedup(self.model, self.t.dedup)
            # Without a plan the wrapper picks its default one: record what is in use.
            self.plan = getattr(self.model, "plan", plan)
        self.optimizer = dense_optimizer(model_io.dense_parameters(self.model),
                                         config.dense_optimizer)
        self.objective = objective_for(config, dataset, self.manifest)
        self.loss_fn = self.objective.loss_fn
        self.use_bf16 = self.t.bf16 and bf16_autocast_supported(self.device)
        self.tracer = Tracer(enabled=self.t.trace is not None)
        self.pipeline: TrainPipeline | None = None
        workers = self.t.num_workers
        train_rows = self.manifest.split("train").rows
        self.sizes = resolve_sizes(self.t, train_rows, self.world_size)
        self.batch_size = self.sizes.batch_size
        self.loader = BatchLoader(
            dataset, "train", self.batch_size, rank=self.rank, world_size=self.world_size,
            shuffle=True, seed=self.t.seed, shuffle_buffer=self.t.shuffle_buffer,
            drop_last=self.t.drop_last, num_workers=workers, manifest=self.manifest,
            pin_memory=self.device.type == "cuda", global_order=self.t.global_order)
        if self.loader.num_batches == 0:
            raise ConfigError(
                f"the training split has {self.loader.rows} rows per rank, fewer than one "
                f"batch of {self.loader.batch_size}", where="training.batch_size",
                hint="lower the batch size or set training.drop_last=false")
        self.val_loader: BatchLoader | None = None
        if self.t.val_split in self.manifest.splits and self.manifest.splits[
                self.t.val_split].rows > 0:
            self.val_loader = BatchLoader.for_scoring(
                dataset, self.t.val_split, config.eval.batch_size, rank=self.rank,
                world_size=self.world_size,
                num_workers=workers, max_rows=self.t.val_max_rows)
        per_epoch = self.loader.num_batches
        self.total_steps = self.t.max_steps or self.sizes.epochs * per_epoch
        self.val_every = self.sizes.val_every
        es = self.t.early_stopping
        self.early = EarlyStopping(self.objective.early_metric, self.objective.early_direction,
                                   es.patience, es.min_delta) \
            if es.enabled and self.val_loader is not None else None
        self.stop_reason: str | None = None
        self.step = 0
        self.position = LoaderPosition(0, 0)
        self.history: list[dict[str, Any]] = []
        self.metrics: dict[str, float] = {}
        # Losses since the last log line: part of the state so a resumed run logs the same.
        # Summed on the device (float64, as Python floats add) and read every log_every
        # steps, so no step waits for its loss.
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.loss_count = 0
        # Rows trained on by this rank over the whole run (truthful: partial batches count
        # as their real size).
        self.rows_trained = 0
        self.parent: dict[str, Any] | None = None  # the warm start's parent model

    def describe(self) -> str:
        """The resolved sizes and early stopping, one line, for the log and the CLI."""
        line = self.sizes.describe().replace(
            f"{self.sizes.steps_per_epoch} steps per epoch, at most {self.sizes.total_steps}",
            f"{self.loader.num_batches} steps per epoch, at most {self.total_steps}")
        line += f"; pipeline {self.pipeline_name}"
        if self.t.pipeline == "auto":
            line += " (auto)"
        if self.config.model.kind == "dlrm":
            line += f"; interaction {self.interaction}"
            if self.config.model.interaction == "auto":
                line += " (auto)"
        if self.early is not None:
            e = self.early
            line += (f"; early stopping on {self.t.val_split}.{e.metric} ({e.mode}, patience "
                     f"{e.patience}, min_delta {e.min_delta})")
        elif self.val_loader is None:
            line += f"; no {self.t.val_split!r} split: no validation, no early stopping"
        carved = self.manifest.transforms.get("val_carved")
        if carved and self.val_loader is not None:
            line += (f"; {self.t.val_split} is {carved['fraction']:.0%} of the training rows "
                     f"drawn with seed {carved['seed']}")
        return line

    # ---- state ------------------------------------------------------------------------
    def _metadata(self) -> dict[str, Any]:
        return {
            "epoch": self.position.epoch,
            "plan": self.plan.to_dict() if self.plan is not None else None,
            "manifest_hash": self.manifest.content_hash(),
            "manifest": self.manifest.to_dict(),
            "config": self.config.to_dict(),
            "tables": model_io.table_info(self.model, self.config),
            "dataset": str(self.dataset),
            # lets `ctrctl eval` link its run to the training run that made the model
            "mlflow_run_id": self.run.run_id,
            "parent": self.parent,
        }

    def save(self, folder: str = "checkpoints", keep: int | None = None,
             extra: dict[str, Any] | None = None) -> Path:
        """Checkpoint the model and the loop's state under ``OUT/folder``."""
        keep = self.t.keep_checkpoints if keep is None else keep
        trainer_state = {
            "step": self.step, "epoch": self.position.epoch, "batch": self.position.batch,
            "history": self.history, "metrics": self.metrics,
            "loss_window": [float(self.loss_sum), self.loss_count],
            "loader": {"seed": self.t.seed, "batch_size": self.batch_size,
                       "world_size": self.world_size},
            "rows_trained": self.rows_trained,
            "early_stopping": self.early.state() if self.early is not None else None,
            "stop_reason": self.stop_reason,
            **(extra or {}),
        }
        path = ckpt.save_checkpoint(
            self.out / folder, self.step, dist_ckpt.table_shards(self.model, self.rank),
            model_io.dense_state(self.model), self.optimizer.state_dict(), trainer_state,
            self._metadata(), rank=self.rank, world_size=self.world_size)
        if self.rank == 0:
            ckpt.prune_checkpoints(self.out / folder, keep)
        return path

    def save_best(self) -> Path:
        """Write the current weights as ``OUT/best`` (the only step folder kept there)."""
        return self.save(BEST, keep=1)

    def restore_best(self) -> None:
        """Load the best validation's weights and optimizer states into the model."""
        assert self.early is not None and self.early.best_step is not None
        path = ckpt.latest_checkpoint(self.out / BEST)
        if path is None or ckpt.read_metadata(path).step != self.early.best_step:
            raise CheckpointError(
                f"the best checkpoint (step {self.early.best_step}) is missing",
                where=str(self.out / BEST), hint="train again with --overwrite")
        self._load_weights(path)
        best = ckpt.load_trainer_state(path)
        # The run ends with the best step's model: report that step's validation metrics.
        self.metrics.update({k: v for k, v in best.get("metrics", {}).items()
                             if k.startswith("val.")})
        logger.info("restored the weights of step %d (best %s.%s %.5f)", self.early.best_step,
                    self.t.val_split, self.early.metric, self.early.best)

    def _load_weights(self, path: Path) -> None:
        model_io.load_tables(self.model, path, with_optimizer=True)
        dense, optim_state = ckpt.load_dense(path)
        model_io.load_dense_state(self.model, dense)
        self.optimizer.load_state_dict(optim_state)

    def restore(self, path: Path) -> None:
        meta = ckpt.read_metadata(path)
        if meta.manifest_hash != self.manifest.content_hash():
            raise CheckpointError(
                "the checkpoint was trained on another dataset (manifest hash differs)",
                where=str(meta.path), hint="resume with the --dataset it was trained on")
        self._load_weights(meta.path)
        state = ckpt.load_trainer_state(meta.path)
        same_world = meta.world_size == self.world_size and state.get("loader", {}).get(
            "batch_size") == self.batch_size
        self.step = int(state["step"])
        self.history = list(state.get("history", []))
        self.metrics = dict(state.get("metrics", {}))
        loss_sum, self.loss_count = state.get("loss_window", [0.0, 0])
        self.loss_sum.fill_(float(loss_sum))
        self.rows_trained = int(state.get("rows_trained", 0))
        self.stop_reason = state.get("stop_reason")
        self.parent = meta.extra.get("parent")
        if self.early is not None and state.get("early_stopping"):
            self.early.load_state(state["early_stopping"])
        # A finished run resumed with a higher cap (or more patience) trains on: from the
        # final checkpoint's weights, which are the best validation's when it restored them.
        if self.stop_reason in ("epochs", "max_steps") and self.step < self.total_steps:
            self.stop_reason = None
        if self.stop_reason == "early_stopping" and (
                self.early is None or not self.early.should_stop):
            self.stop_reason = None
        if same_world:
            self.position = LoaderPosition(int(state["epoch"]), int(state["batch"]))
            ckpt.restore_rng_state(ckpt.load_rng_state(meta.path, self.rank))
        else:
            # Another world size or batch size: batches are cut differently, so continue at
            # the start of the next epoch rather than pretending to be exact.
            self.position = LoaderPosition(int(state["epoch"]) + (int(state["batch"]) > 0), 0)
            logger.warning("resuming with another world or batch size: continuing at epoch %d",
                           self.position.epoch)
        logger.info("resumed from %s at step %d (epoch %d, batch %d)", meta.path, self.step,
                    self.position.epoch, self.position.batch)

    # ---- steps ------------------------------------------------------------------------
    def _validate(self) -> dict[str, float] | None:
        if self.val_loader is None:
            return None
        values = self.objective.validate(self.model, self.val_loader, self.device,
                                         self.world_size, self.pipeline)
        entry = {"step": self.step, **{f"val.{k}": v for k, v in values.items()}}
        self.history.append(entry)
        self.metrics.update({k: v for k, v in entry.items() if k != "step"})
        zch = collision_metrics(self.model)  # every rank: the remapper shards' counters sum
        if self.rank == 0:
            self.run.log_metrics({k: v for k, v in entry.items() if k != "step"} | zch,
                                 step=self.step)
            logger.info("step %d: %s", self.step,
                        " ".join(f"{k}={format_value(k, v)}" for k, v in entry.items()
                                 if k != "step"))
        return values

    def _check_early_stopping(self, values: dict[str, float] | None) -> bool:
        """Track the best validation (saving its weights); True when patience is spent."""
        if self.early is None or values is None:
            return False
        value = values.get(self.early.metric)
        if value is None:
            return False
        improved = self.early.update(value, self.step)
        if improved:
            self.save_best()
        if self.rank == 0:
            self.run.log_metrics({"early_stopping.best": float(self.early.best or 0.0),
                                  "early_stopping.bad_validations": float(self.early.bad)},
                                 step=self.step)
        return self.early.should_stop

    def _batches(self):  # type: ignore[no-untyped-def]
        epoch, start = self.position.epoch, self.position.batch
        while True:
            if start >= self.loader.num_batches:
                epoch, start = epoch + 1, 0
            for i, batch in enumerate(self.loader.epoch(epoch, start), start=start):
                yield LoaderPosition(epoch, i + 1), batch
            epoch, start = epoch + 1, 0

    def make_pipeline(self) -> TrainPipeline:
        """The step's stages (``training.pipeline``); semi-sync's start step counts from the
        run's first step, resumed or not."""
        return make_pipeline(self.pipeline_name, self.model, self.optimizer, self.device,
                             loss_fn=self.loss_fn, autocast=self.use_bf16, tracer=self.tracer,
                             start_step=max(0, self.t.semi_sync_start_step - self.step))

    def _check_loss(self, value: float) -> None:
        if not math.isfinite(value):
            raise ConfigError(f"the loss is {value} by step {self.step}",
                              hint="lower the learning rates")

    def fit(self) -> float:
        """Train until the step cap, early stopping or ``stop_after``; returns samples/s."""
        t = self.t
        if t.bf16 and not self.use_bf16:
            logger.warning("training.bf16: this %s has no bf16 units (AMX-BF16 or "
                           "AVX512-BF16); training in fp32", self.device.type)
        self.model.train()
        world_rows = self.loader.rows * self.world_size  # rows per epoch over all ranks
        total = world_rows * self.sizes.epochs if t.max_steps is None else \
            self.total_steps * self.batch_size
        self.progress.start("train", total=total, unit="samples")
        if self.rows_trained:
            self.progress.advance(self.rows_trained * self.world_size)
        started, rows_this_run = time.perf_counter(), 0
        steps_this_run = 0
        # On CPU reading a loss costs nothing: check every step; on CUDA at log steps.
        check_every = 1 if self.device.type == "cpu" else t.log_every
        shown: float | None = None
        # Only the batches this call will train on: the pipeline reads none beyond them.
        remaining = self.total_steps - self.step
        if self.stop_after is not None:
            remaining = min(remaining, self.stop_after)
        source = self._batches()
        batches = itertools.islice(source, max(0, remaining))
        self.pipeline = pipeline = self.make_pipeline()
        failed = True
        try:
            while self.step < self.total_steps and self.stop_reason is None:
                if self.stop_after is not None and steps_this_run >= self.stop_after:
                    break
                try:
                    out = pipeline.progress(batches)
                except StopIteration:  # a rank's loader ran dry (every rank stops here)
                    logger.warning("the training data ended at step %d", self.step)
                    break
                position: LoaderPosition = out.tag
                self.step += 1
                steps_this_run += 1
                self.position = position
                self.loss_sum += out.loss
                self.loss_count += 1
                if self.step % check_every == 0:
                    shown = float(out.loss)
                    self._check_loss(shown)
                self.rows_trained += out.rows
                rows_this_run += out.rows
                self.progress.advance(out.rows * self.world_size, epoch=position.epoch,
                                      **({"loss": shown} if shown is not None else {}))
                if self.step % t.log_every == 0 or self.step == self.total_steps:
                    mean = float(self.loss_sum) / self.loss_count
                    self._check_loss(mean)
                    elapsed = max(time.perf_counter() - started, 1e-9)
                    entry = {"step": self.step, "train.loss": mean,
                             "train.samples_per_s": rows_this_run * self.world_size / elapsed,
                             "epoch": position.epoch}
                    self.history.append(entry)
                    self.metrics["train.loss"] = mean
                    if self.rank == 0:
                        self.run.log_metrics({k: v for k, v in entry.items() if k != "step"},
                                             step=self.step)
                    self.loss_sum.zero_()
                    self.loss_count = 0
                last = self.step >= self.total_steps
                if (self.val_every and self.step % self.val_every == 0) or \
                        (last and self.val_loader is not None):
                    values = self._validate()
                    if self._check_early_stopping(values):
                        self.stop_reason = "early_stopping"
                    elif values and self.on_validation and self.on_validation(self.step, values):
                        self.stop_reason = "pruned"  # a search gave up on this run
                if last and self.stop_reason is None:
                    self.stop_reason = "max_steps" if t.max_steps else "epochs"
                if (t.checkpoint_every and self.step % t.checkpoint_every == 0
                        and self.stop_reason is None):
                    self.save()
            failed = False
        finally:
            # on an error, what is in flight is dropped: a failed peer may never finish it
            pipeline.close(wait=not failed)  # its loading thread stops reading the source
            self.pipeline = None
            source.close()
            self.progress.finish(completed=not failed)  # a bar an error stopped ends too
        if t.trace is not None:
            path = write_trace(t.trace, self.tracer)
            if path is not None:
                logger.info("wrote the pipeline's trace to %s", path)
        elapsed = max(time.perf_counter() - started, 1e-9)
        return global_sum(rows_this_run, self.world_size) / elapsed

    def finish(self) -> Path:
        """End a finished run: the best weights back in place, then the final checkpoint."""
        if self.early is not None and self.t.early_stopping.restore_best and self.early.best_step is not None \
                and self.early.best_step != self.step:
            self.restore_best()
        elif self.val_loader is None:
            logger.info("no %r split: the final model is the last step's", self.t.val_split)
        return self.save()

    def summary(self) -> dict[str, Any]:
        """What ended the run and where the best validation was (metrics.json, MLflow)."""
        e = self.early
        return {
            "stop_reason": self.stop_reason,
            "best_step": e.best_step if e is not None else None,
            "best_value": e.best if e is not None else None,
            "early_stopping_metric": f"{self.t.val_split}.{e.metric}" if e is not None else None,
            "restored_best": bool(e is not None and e.best_step is not None
                                  and self.t.early_stopping.restore_best),
            # the split validated on; ``carved``: drawn from train by preprocess (and how)
            "val": {"split": self.t.val_split,
                    "rows": self.manifest.splits[self.t.val_split].rows
                    if self.val_loader is not None else 0,
                    "carved": self.manifest.transforms.get("val_carved")},
            "sizes": {"batch_size": self.batch_size, "epochs": self.sizes.epochs,
                      "max_steps": self.t.max_steps, "val_every": self.val_every,
                      "steps_per_epoch": self.loader.num_batches,
                      "total_steps": self.total_steps, "chosen": list(self.sizes.chosen),
                      "train_rows": self.loader.rows * self.world_size},
        }


def _already_finished(trainer: _Trainer, checkpoint: Path, run: Run) -> TrainResult:
    """A resume of a finished run: say so and change nothing (no step, no checkpoint)."""
    if trainer.rank == 0:
        logger.info("%s already finished at step %d (%s): nothing to train; pass a higher "
                    "cap (training.epochs / max_steps) to continue or --overwrite to start "
                    "over", trainer.out, trainer.step, trainer.stop_reason)
        run.set_tags({"already_finished": "true", "stop_reason": str(trainer.stop_reason)})
    summary = trainer.summary()
    return TrainResult(out=trainer.out, step=trainer.step, checkpoint=checkpoint,
                       metrics=dict(trainer.metrics), history=list(trainer.history),
                       stop_reason=trainer.stop_reason, best_step=summary["best_step"],
                       already_finished=True)


def train(
    dataset: str | Path,
    out: str | Path,
    config: PipelineConfig,
    *,
    resume: bool = False,
    overwrite: bool = False,
    plan: ShardingPlan | None = None,
    tracker: Tracker | None = None,
    progress: Progress | None = None,
    stop_after: int | None = None,
    on_validation: OnValidation | None = None,
) -> TrainResult:
    """Train a DLRM on a dataset's train split, validating and checkpointing along the way.

    Args:
        dataset: the dataset folder (``ctrctl preprocess`` output).
        out: the output folder: ``checkpoints/``, ``metrics.json``, ``config.json``.
        config: the resolved pipeline config (``model``, optimizers, ``training``).
        resume: continue from ``out/checkpoints/latest`` (starts fresh when there is none).
        overwrite: allow an output folder that already holds checkpoints without resuming.
        plan: the sharding plan for ``world_size > 1`` (None: the default plan).
        tracker: where metrics, the config and the final model are tracked (rank 0 only).
        progress: a progress reporter (samples).
        stop_after: stop after this many steps of this call, checkpointing there (to test
            resume; the run then continues with ``resume=True``).
        on_validation: called with (step, val metrics) after each validation, on every
            rank; True stops the run there (``stop_reason`` ``pruned``), as a search's pruner.

    Returns:
        A :class:`TrainResult`.

    Raises:
        OutputExistsError: ``out`` holds checkpoints and neither ``resume`` nor ``overwrite``.
        CheckpointError: resuming from a checkpoint of another dataset or model.

    Example:
        >>> train("data/criteo", "runs/a", load_config("pipelines/small.yaml"))
    """
    dataset, out = Path(dataset), Path(out)
    rank, world_size = world()
    if config.training.trace is not None:  # written at the end: checked before training
        check_output_location(config.training.trace, folder=False, option="--trace (training.trace)")
    # Only rank 0 tracks and reports progress, whatever the caller passed to the others.
    tracker = tracker if tracker is not None and rank == 0 else Tracker()
    progress = progress if progress is not None and rank == 0 else Progress()
    existing = ckpt.latest_checkpoint(out / "checkpoints") if (out / "checkpoints").is_dir() \
        else None
    if existing is not None and not resume and not overwrite:
        raise OutputExistsError("the output folder already holds checkpoints", where=str(out),
                                hint="pass --resume to continue or --overwrite to start over")
    if existing is not None and overwrite and not resume and rank == 0:
        import shutil

        shutil.rmtree(out / "checkpoints")
    if world_size > 1:
        dist.barrier()
    kept = "checkpoints written before are kept"
    with writing(out, kept), tracker.run("train") as run:
        trainer = _Trainer(dataset, out, config, plan, run, progress, stop_after, on_validation)
        if resume and existing is not None:
            trainer.restore(existing)
            if trainer.stop_reason is not None:  # every rank restored the same state
                return _already_finished(trainer, existing, run)
        elif config.training.init_from:  # fresh steps, schedule and data order
            parent = warm_start(trainer.model, trainer.optimizer, resolve_parent(
                config.training.init_from, getattr(tracker, "tracking_uri", None)),
                trainer.manifest, config)
            trainer.parent = parent.to_dict()
            run.set_tags(parent.tags())
        if rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            write_json_atomic(out / "config.json", config.to_dict())
            run.log_params({"dataset": str(dataset), "world_size": world_size,
                            "resumed_from_step": trainer.step, **config.to_dict()})
            run.log_dict(config.to_dict(), "config.json")
        if rank == 0:
            logger.info("training: %s", trainer.describe())
            run.set_tags(native.log_report(logger).as_tags())
            if trainer.total_steps < FEW_STEPS:
                logger.warning(
                    "this run takes only %d optimizer steps: the model will barely train; "
                    "lower training.batch_size or raise training.epochs", trainer.total_steps)
            run.log_params({f"resolved.{k}": v for k, v in trainer.summary()["sizes"].items()}
                           | {"resolved.interaction": trainer.interaction})
        rate = trainer.fit()
        finished = trainer.stop_reason is not None
        path = trainer.finish() if finished else trainer.save()
        summary = trainer.summary()
        # after the final checkpoint, so its flush's write-backs are counted
        cache = gather_cache_metrics(trainer.model, world_size)
        zch = collision_metrics(trainer.model)  # on every rank (summed over the shards)
        result = TrainResult(out=out, step=trainer.step, checkpoint=path,
                             metrics=dict(trainer.metrics), history=list(trainer.history),
                             samples_per_s=rate, stop_reason=trainer.stop_reason,
                             best_step=summary["best_step"], cache=cache)
        if rank == 0:
            write_json_atomic(out / "metrics.json", {
                "step": trainer.step, "finished": finished, **summary,
                "rows_trained": trainer.rows_trained * world_size,
                "metrics": result.metrics, "samples_per_s": rate, "history": result.history,
                "checkpoint": str(path), **({"cache": cache} if cache else {}),
                **({"collisions": zch} if zch else {})})
            if cache:
                run.log_metrics(cache, step=trainer.step)
                logger.info("cached tables:\n%s", format_cache_report(cache))
            if zch:
                run.log_metrics(zch, step=trainer.step)
                logger.info("managed-collision tables:\n%s", format_collision_report(zch))
            run.log_metrics({"train.samples_per_s_total": rate}, step=trainer.step)
            # The kept model's validation (the best step's when its weights were restored),
            # logged last at the final step, so MLflow's runs list shows it, not the last one.
            kept_val = {k: v for k, v in result.metrics.items() if k.startswith("val.")}
            if kept_val:
                run.log_metrics(kept_val, step=trainer.step)
            if summary["best_step"] is not None:
                run.log_metrics({"early_stopping.best_step": float(summary["best_step"])},
                                step=trainer.step)
            run.set_tags({"stop_reason": str(trainer.stop_reason),
                          "best_step": str(summary["best_step"])})
            run.log_artifact(out / "metrics.json")
            if finished and config.training.log_checkpoint:
                run.log_artifact(path, "model")
    return result
