"""The train loop: batches -> DLRM -> BCE loss -> fused embedding update + dense optimizer step.

One loop for one process and for many: under ``torch.distributed`` (started by torchrun, see
:mod:`ctrctl.training.launch`) the loop takes its rank and world size from the default process
group, the loader gives each rank its slice (``batch_size / world_size`` rows per step), the
model is wrapped by :func:`ctrctl.training.model.wrap_model`, and only rank 0 logs, tracks and
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

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ctrctl import checkpoint as ckpt
from ctrctl.compat import bf16_autocast_supported
from ctrctl.config import PipelineConfig
from ctrctl.data.dataset import BatchLoader, LoaderPosition
from ctrctl.data.manifest import DatasetManifest
from ctrctl.distributed import checkpoint as dist_ckpt
from ctrctl.distributed.types import ShardingPlan
from ctrctl.errors import CheckpointError, ConfigError, OutputExistsError
from ctrctl.io import write_json_atomic
from ctrctl.progress import Progress
from ctrctl.tracking import Run, Tracker
from ctrctl.training import model as model_io
from ctrctl.training.optimizers import dense_optimizer

__all__ = ["TrainResult", "evaluate_model", "resolve_device", "train"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainResult:
    """What :func:`train` did.

    Attributes:
        out: the output folder.
        step: optimizer steps taken in total (including those before a resume).
        checkpoint: the final checkpoint's step folder.
        metrics: the final metrics (``val.auc``, ``val.logloss``, ``train.loss``, ...).
        history: one entry per logged step and validation.
        samples_per_s: training throughput of this run (global samples).
    """

    out: Path
    step: int
    checkpoint: Path
    metrics: dict[str, float]
    history: list[dict[str, Any]] = field(default_factory=list)
    samples_per_s: float = 0.0


def resolve_device(kind: str) -> torch.device:
    """``auto`` -> cuda when present (this rank's local device), else cpu."""
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("training.device is cuda but no CUDA device is present",
                              where="training.device", hint="use auto or cpu")
        import os

        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@torch.no_grad()
def evaluate_model(
    model: nn.Module,
    loader: BatchLoader,
    device: torch.device,
    world_size: int = 1,
) -> dict[str, float]:
    """Validation metrics of ``model`` over a scoring loader, the same as ``ctrctl eval``'s.

    The scores stream into a :class:`~ctrctl.metrics.CTRMetrics` (exact by sorting up to its
    ``exact_limit`` rows, then a histogram with its error bound); with ``world_size > 1``
    each rank scores its slice and the metric's states are combined over the default group
    (torchmetrics' sync), so every rank returns the same numbers.

    Returns:
        ``rows``, ``logloss`` and, when defined for the rows, ``auc``, ``auc_bound``, ``ne``
        and ``calibration``.
    """
    from ctrctl.metrics.streaming import CTRMetrics

    was_training = model.training
    model.eval()
    metric = CTRMetrics()
    steps = loader.num_batches
    if world_size > 1:
        # A sharded model runs collectives in forward: every rank must take as many steps,
        # though scoring slices may differ by a row (and so by a batch). A rank that runs
        # out repeats its last batch and drops the result.
        count = torch.tensor([steps], dtype=torch.int64)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        steps = int(count.item())
    batches = loader.epoch(0)
    last = None
    for _ in range(steps):
        batch = next(batches, None)
        keep = batch is not None
        batch = batch if batch is not None else last
        if batch is None:
            break
        last = batch
        batch = batch.to(device)
        logits = model(batch.dense, batch.sparse)
        if keep:
            metric.update(batch.labels.cpu(), torch.sigmoid(logits.float()).cpu())
    batches.close()
    model.train(was_training)
    if world_size > 1 and device.type == "cuda":
        metric = metric.to(device)  # NCCL syncs device tensors
    m = metric.compute()
    out = {"rows": float(m.rows)}
    for key in ("auc", "auc_bound", "logloss", "ne", "calibration"):
        value = getattr(m, key)
        if value is not None:
            out[key] = float(value)
    return out


class _Trainer:
    """The loop's state and steps; :func:`train` is its public face."""

    def __init__(self, dataset: Path, out: Path, config: PipelineConfig,
                 plan: ShardingPlan | None, tracker_run: Run, progress: Progress,
                 stop_after: int | None) -> None:
        self.dataset, self.out, self.config = dataset, out, config
        self.t = config.training
        self.run, self.progress = tracker_run, progress
        self.rank, self.world_size = _world()
        self.device = resolve_device(self.t.device)
        self.manifest = DatasetManifest.load(dataset)
        self.plan = plan
        self.stop_after = stop_after

        torch.manual_seed(self.t.seed)
        self.model = model_io.build_model(config, self.manifest, self.device)
        if self.world_size > 1:
            self.model = model_io.wrap_model(self.model, plan, None)
            # Without a plan the wrapper picks its default one: record what is in use.
            self.plan = getattr(self.model, "plan", plan)
        self.optimizer = dense_optimizer(model_io.dense_parameters(self.model),
                                         config.dense_optimizer)
        self.loss_fn = nn.BCEWithLogitsLoss()
        workers = self.t.num_workers
        self.loader = BatchLoader(
            dataset, "train", self.t.batch_size, rank=self.rank, world_size=self.world_size,
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
        self.total_steps = self.t.max_steps or self.t.epochs * per_epoch
        self.step = 0
        self.position = LoaderPosition(0, 0)
        self.history: list[dict[str, Any]] = []
        self.metrics: dict[str, float] = {}
        # Losses since the last log line: part of the state so a resumed run logs the same.
        self.loss_sum, self.loss_count = 0.0, 0

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
        }

    def save(self) -> Path:
        trainer_state = {
            "step": self.step, "epoch": self.position.epoch, "batch": self.position.batch,
            "history": self.history, "metrics": self.metrics,
            "loss_window": [self.loss_sum, self.loss_count],
            "loader": {"seed": self.t.seed, "batch_size": self.t.batch_size,
                       "world_size": self.world_size},
        }
        return ckpt.save_checkpoint(
            self.out / "checkpoints", self.step, dist_ckpt.table_shards(self.model, self.rank),
            model_io.dense_state(self.model), self.optimizer.state_dict(), trainer_state,
            self._metadata(), rank=self.rank, world_size=self.world_size)

    def restore(self, path: Path) -> None:
        meta = ckpt.read_metadata(path)
        if meta.manifest_hash != self.manifest.content_hash():
            raise CheckpointError(
                "the checkpoint was trained on another dataset (manifest hash differs)",
                where=str(meta.path), hint="resume with the --dataset it was trained on")
        model_io.load_tables(self.model, meta.path, with_optimizer=True)
        dense, optim_state = ckpt.load_dense(meta.path)
        model_io.load_dense_state(self.model, dense)
        self.optimizer.load_state_dict(optim_state)
        state = ckpt.load_trainer_state(meta.path)
        same_world = meta.world_size == self.world_size and state.get("loader", {}).get(
            "batch_size") == self.t.batch_size
        self.step = int(state["step"])
        self.history = list(state.get("history", []))
        self.metrics = dict(state.get("metrics", {}))
        self.loss_sum, self.loss_count = state.get("loss_window", [0.0, 0])
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
    def _validate(self) -> None:
        if self.val_loader is None:
            return
        values = evaluate_model(self.model, self.val_loader, self.device, self.world_size)
        entry = {"step": self.step, **{f"val.{k}": v for k, v in values.items()}}
        self.history.append(entry)
        self.metrics.update({k: v for k, v in entry.items() if k != "step"})
        if self.rank == 0:
            self.run.log_metrics({k: v for k, v in entry.items() if k != "step"},
                                 step=self.step)
            logger.info("step %d: %s", self.step,
                        " ".join(f"{k}={v:.4f}" for k, v in entry.items() if k != "step"))

    def _batches(self):  # type: ignore[no-untyped-def]
        epoch, start = self.position.epoch, self.position.batch
        while True:
            if start >= self.loader.num_batches:
                epoch, start = epoch + 1, 0
            for i, batch in enumerate(self.loader.epoch(epoch, start), start=start):
                yield LoaderPosition(epoch, i + 1), batch
            epoch, start = epoch + 1, 0

    def fit(self) -> float:
        t = self.t
        use_bf16 = t.bf16 and bf16_autocast_supported(self.device)
        if t.bf16 and not use_bf16:
            logger.warning("training.bf16: this %s has no bf16 units (AMX-BF16 or "
                           "AVX512-BF16); training in fp32", self.device.type)
        model = self.model
        model.train()
        self.progress.start("train", total=self.total_steps * t.batch_size, unit="samples")
        if self.step:
            self.progress.advance(self.step * t.batch_size)
        started, samples = time.perf_counter(), 0
        steps_this_run = 0
        batches = self._batches()
        while self.step < self.total_steps:
            if self.stop_after is not None and steps_this_run >= self.stop_after:
                break
            position, batch = next(batches)
            batch = batch.to(self.device, non_blocking=True)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=use_bf16):
                logits = model(batch.dense, batch.sparse)
            loss = self.loss_fn(logits.float(), batch.labels)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()  # the embedding tables update here (fused optimizer)
            self.optimizer.step()
            self.step += 1
            steps_this_run += 1
            self.position = position
            value = float(loss.detach())
            if not math.isfinite(value):
                raise ConfigError(f"the loss is {value} at step {self.step}",
                                  hint="lower the learning rates")
            self.loss_sum += value
            self.loss_count += 1
            samples += t.batch_size
            self.progress.advance(t.batch_size, loss=value, epoch=position.epoch)
            if self.step % t.log_every == 0 or self.step == self.total_steps:
                mean = self.loss_sum / self.loss_count
                elapsed = max(time.perf_counter() - started, 1e-9)
                entry = {"step": self.step, "train.loss": mean,
                         "train.samples_per_s": samples / elapsed, "epoch": position.epoch}
                self.history.append(entry)
                self.metrics["train.loss"] = mean
                if self.rank == 0:
                    self.run.log_metrics({k: v for k, v in entry.items() if k != "step"},
                                         step=self.step)
                self.loss_sum, self.loss_count = 0.0, 0
            if t.val_every and self.step % t.val_every == 0 and self.step < self.total_steps:
                self._validate()
            if (t.checkpoint_every and self.step % t.checkpoint_every == 0
                    and self.step < self.total_steps):
                self.save()
        self.progress.finish()
        batches.close()
        elapsed = max(time.perf_counter() - started, 1e-9)
        return samples / elapsed


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

    Returns:
        A :class:`TrainResult`.

    Raises:
        OutputExistsError: ``out`` holds checkpoints and neither ``resume`` nor ``overwrite``.
        CheckpointError: resuming from a checkpoint of another dataset or model.

    Example:
        >>> train("data/criteo", "runs/a", load_config("pipelines/small.yaml"))
    """
    dataset, out = Path(dataset), Path(out)
    rank, world_size = _world()
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
    with tracker.run("train") as run:
        trainer = _Trainer(dataset, out, config, plan, run, progress, stop_after)
        if resume and existing is not None:
            trainer.restore(existing)
        if rank == 0:
            out.mkdir(parents=True, exist_ok=True)
            write_json_atomic(out / "config.json", config.to_dict())
            run.log_params({"dataset": str(dataset), "world_size": world_size,
                            "resumed_from_step": trainer.step, **config.to_dict()})
            run.log_dict(config.to_dict(), "config.json")
        rate = trainer.fit()
        finished = trainer.step >= trainer.total_steps
        if finished:
            trainer._validate()
        path = trainer.save()
        result = TrainResult(out=out, step=trainer.step, checkpoint=path,
                             metrics=dict(trainer.metrics), history=list(trainer.history),
                             samples_per_s=rate)
        if rank == 0:
            write_json_atomic(out / "metrics.json", {
                "step": trainer.step, "finished": finished, "metrics": result.metrics,
                "samples_per_s": rate, "history": result.history,
                "checkpoint": str(path)})
            run.log_metrics({"train.samples_per_s_total": rate}, step=trainer.step)
            run.log_artifact(out / "metrics.json")
            if finished:
                run.log_artifact(path, "model")
    return result
