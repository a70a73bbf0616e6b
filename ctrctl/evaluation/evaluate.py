"""``ctrctl eval`` as a library call: score a split, measure, compare, gate, write, track.

Example:
    >>> result = evaluate("eval-out", checkpoint="ckpt", dataset="dataset", split="test",
    ...                   segment_by=["C9"], gates=["auc>=0.70", "calibration=1+-0.1"])
    >>> result.metrics["auc"], result.metrics["calibration"]
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ctrctl.data.manifest import DatasetManifest
from ctrctl.errors import ConfigError, DatasetError, DistributedError
from ctrctl.evaluation.baselines import (
    DEFAULT_SMOOTHING,
    base_rate_baseline,
    feature_ctr_baselines,
)
from ctrctl.evaluation.gates import Gate, GateResult, check_gates, parse_gates, raise_for_failures
from ctrctl.evaluation.outputs import write_csv
from ctrctl.evaluation.segments import SegmentAccumulator
from ctrctl.evaluation.sources import (
    ScoreBatch,
    checkpoint_scores,
    predictions_scores,
    rank_range,
)
from ctrctl.io import (
    check_destination,
    publish_staged,
    refuse_output_over_inputs,
    stage_folder,
    write_json_atomic,
    writing,
)
from ctrctl.metrics.calibration import DEFAULT_BINS
from ctrctl.metrics.streaming import (
    DEFAULT_EXACT_LIMIT,
    DEFAULT_NUM_BINS,
    CTRMetrics,
    Metrics,
)
from ctrctl.progress import NullProgress, Progress
from ctrctl.tracking import Tracker

logger = logging.getLogger(__name__)

#: Checkpoint metadata files and keys that may record the MLflow run that trained it.
_META_FILES = ("metadata.json", "meta.json", "checkpoint.json")
_RUN_KEYS = ("mlflow_run_id", "run_id", "tracking_run_id", "training_run_id")


@dataclass
class EvalResult:
    """What :func:`evaluate` measured and wrote.

    Attributes:
        metrics: the flat content of metrics.json.
        details: the full metrics (reliability bins, histogram, undefined reasons).
        segments: feature -> one row per segment value.
        baselines: one entry per baseline.
        gates: each gate's result.
        out: the output folder (rank 0), None on other ranks.
        run_id: the MLflow run, when tracked.
    """

    metrics: dict[str, Any]
    details: Metrics
    segments: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    baselines: list[dict[str, Any]] = field(default_factory=list)
    gates: list[GateResult] = field(default_factory=list)
    out: Path | None = None
    run_id: str | None = None

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.gates)


def _rank_and_world(group: Any) -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def _broadcast(value: Any, group: Any) -> Any:
    """Rank 0's value on every rank (identity on one process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def _find_run_id(data: Any, depth: int = 0) -> str | None:
    if not isinstance(data, dict) or depth > 3:
        return None
    for key in _RUN_KEYS:
        if isinstance(data.get(key), str) and data[key]:
            return str(data[key])
    for value in data.values():
        found = _find_run_id(value, depth + 1)
        if found:
            return found
    return None


def training_run_id(checkpoint: Path | None) -> str | None:
    """The MLflow run id that the checkpoint's metadata (or its trainer state) records."""
    if checkpoint is None:
        return None
    folders = [Path(checkpoint)]
    try:
        from ctrctl.checkpoint import resolve_checkpoint

        folders.insert(0, resolve_checkpoint(checkpoint))
    except Exception:  # noqa: BLE001 - an unknown layout simply records no run id
        pass
    for folder in folders:
        for name in (*_META_FILES, "trainer_state.json"):
            path = folder / name
            if not path.is_file():
                continue
            try:
                found = _find_run_id(json.loads(path.read_text()))
            except (OSError, json.JSONDecodeError):
                continue
            if found:
                return found
    return None


def recorded_dataset(checkpoint: Path) -> Path | None:
    """The dataset folder the checkpoint was trained on, when it records one that exists."""
    try:
        from ctrctl.checkpoint import read_metadata

        recorded = read_metadata(checkpoint).extra.get("dataset")
    except Exception:  # noqa: BLE001 - no usable record: the caller asks for --dataset
        return None
    if recorded and (Path(recorded) / "manifest.json").is_file():
        logger.info("evaluating on the training dataset %s", recorded)
        return Path(recorded)
    return None


def checkpoint_status(checkpoint: Path) -> dict[str, Any]:
    """Whether the scored checkpoint is a finished run's final one.

    Returns ``checkpoint_step`` and ``checkpoint_finished`` (False: the run stopped before
    its end, e.g. killed, and this is a periodic checkpoint; None: a checkpoint that does not
    say); logs a warning for an unfinished run.
    """
    from ctrctl.checkpoint import load_trainer_state, read_metadata

    meta = read_metadata(checkpoint)
    state = load_trainer_state(meta.path)
    finished = (state["stop_reason"] is not None) if "stop_reason" in state else None
    if finished is False:
        logger.warning("%s is a checkpoint of a run that did not finish (step %d): scoring a "
                       "non-final model", meta.path, meta.step)
    return {"checkpoint_step": meta.step, "checkpoint_finished": finished}


class _PredictionWriter:
    """Streams this rank's evaluated rows to ``folder/part-<rank>.parquet``."""

    def __init__(self, folder: Path, rank: int):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"part-{rank:05d}.parquet"
        self._writer: Any = None

    def write(self, batch: ScoreBatch, first_row: int | None = None) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns = {}
        if first_row is not None:  # the row's position in the split (file order): a key
            columns["row"] = pa.array(np.arange(first_row, first_row + len(batch),
                                                dtype=np.int64))
        columns |= {"label": pa.array(batch.labels.astype(np.int8)),
                    "score": pa.array(batch.scores.astype(np.float32))}
        if batch.weights is not None:
            columns["weight"] = pa.array(batch.weights.astype(np.float32))
        columns |= {k: pa.array(v) for k, v in batch.features.items()}
        table = pa.table(columns)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, table.schema)
        self._writer.write_table(table)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _flat_metrics(
    details: Metrics,
    baselines: list[dict[str, Any]],
    context: dict[str, Any],
    num_bins: int,
    ece_bins: int,
) -> dict[str, Any]:
    flat: dict[str, Any] = details.scalars()
    flat |= {"num_bins": num_bins, "ece_bins": ece_bins}
    flat |= {f"undefined_{k}": v for k, v in details.undefined.items()}
    base = next((b for b in baselines if b["baseline"] == "base_rate"), None)
    if base is not None:
        flat["baseline_base_rate_logloss"] = base["logloss"]
    features = [b for b in baselines if b["feature"] and b["auc"] is not None]
    if features:
        best = max(features, key=lambda b: b["auc"])
        flat |= {
            "baseline_feature": best["feature"],
            "baseline_feature_auc": best["auc"],
            "baseline_feature_logloss": best["logloss"],
        }
        if details.auc is not None:
            flat["auc_lift"] = details.auc - best["auc"]
        if details.logloss is not None and best["logloss"]:
            flat["logloss_lift"] = (best["logloss"] - details.logloss) / best["logloss"]
    return flat | context


def _scores(
    checkpoint: Path | None, dataset: Path | None, predictions: Path | None, split: str,
    features: Sequence[str], rank: int, world_size: int, batch_size: int,
) -> Iterator[ScoreBatch]:
    if predictions is not None:
        return predictions_scores(predictions, features, rank, world_size,
                                  dataset=dataset, split=split)
    assert checkpoint is not None and dataset is not None
    return checkpoint_scores(checkpoint, dataset, split, features, rank, world_size, batch_size)


def _check_sources(
    checkpoint: Path | None, dataset: Path | None, predictions: Path | None
) -> None:
    if predictions is None and (checkpoint is None or dataset is None):
        raise ConfigError(
            "nothing to evaluate",
            hint="pass --checkpoint and --dataset, or --predictions FILE.parquet",
        )
    if predictions is not None and checkpoint is not None:
        raise ConfigError("pass either --checkpoint or --predictions, not both")
    if checkpoint is not None:  # before anything is read or staged: a wrong path, at once
        from ctrctl.checkpoint import read_metadata

        read_metadata(checkpoint)


def evaluate(
    out: str | Path,
    *,
    checkpoint: str | Path | None = None,
    dataset: str | Path | None = None,
    predictions: str | Path | None = None,
    split: str = "test",
    segment_by: Sequence[str] = (),
    gates: Sequence[str | Gate] = (),
    save_predictions: bool = False,
    keep: Sequence[str] = (),
    baselines: bool = True,
    smoothing: float = DEFAULT_SMOOTHING,
    overwrite: bool = False,
    batch_size: int = 8192,
    num_bins: int = DEFAULT_NUM_BINS,
    exact_limit: int = DEFAULT_EXACT_LIMIT,
    ece_bins: int = DEFAULT_BINS,
    tracker: Tracker | None = None,
    progress: Progress | None = None,
    group: Any = None,
    gates_raise: bool = True,
) -> EvalResult:
    """Evaluate a model's scores on a split and write the output folder.

    Under ``torch.distributed`` each rank scores its share of the rows, the metric state is
    merged exactly, and rank 0 writes and tracks.

    Args:
        out: output folder (written atomically; refused if it exists unless ``overwrite``).
        checkpoint: a training checkpoint folder (with ``dataset``).
        dataset: a preprocessed dataset folder.
        predictions: a Parquet file of ``label, score`` (instead of a checkpoint).
        split: the dataset split to evaluate.
        segment_by: features to compute per-value metrics for.
        gates: thresholds such as ``"auc>=0.7"``; checked after writing.
        save_predictions: also write the evaluated labels and scores as Parquet (with a
            ``row`` column, the row's position in the split, when scoring a checkpoint).
        keep: feature columns of the dataset to copy beside each saved prediction.
        baselines: score the base-rate and per-feature CTR baselines (needs ``dataset``).
        smoothing: pseudo-impressions of the per-feature CTR baseline.
        overwrite: replace an existing ``out``.
        batch_size: scoring batch size.
        num_bins: score-histogram bins for streaming AUC.
        exact_limit: rows held for exact AUC / PR-AUC / ECE.
        ece_bins: equal-mass bins for ECE and the reliability diagram.
        tracker: MLflow tracker (default: none).
        progress: progress reporter.
        group: process group (default: the default group when initialised).
        gates_raise: raise GateError for a failed gate (False: only record it in the result
            and gates.json, as the ranks under ``--nproc-per-node`` do).

    Returns:
        An :class:`EvalResult`.

    Raises:
        ConfigError: a malformed gate, an unknown metric or missing inputs (before scoring).
        OutputExistsError: ``out`` exists and ``overwrite`` is False.
        GateError: a gate failed (after the outputs are written and tracked).
    """
    out = Path(out)
    checkpoint = Path(checkpoint) if checkpoint is not None else None
    dataset = Path(dataset) if dataset is not None else None
    predictions = Path(predictions) if predictions is not None else None
    if batch_size < 1:
        raise ConfigError(f"batch_size must be at least 1, not {batch_size}",
                          hint="e.g. --batch-size 8192")
    parsed = tuple(g if isinstance(g, Gate) else parse_gates([g])[0] for g in gates)
    if checkpoint is not None and dataset is None:
        dataset = recorded_dataset(checkpoint)
    _check_sources(checkpoint, dataset, predictions)
    refuse_output_over_inputs(out, [checkpoint, dataset, predictions])
    rank, world_size = _rank_and_world(group)
    check_destination(out, overwrite)
    progress = progress or NullProgress()
    tracker = tracker or Tracker()

    staging = _broadcast(stage_folder(out, overwrite=overwrite) if rank == 0 else None, group)
    try:
        with writing(out):
            result = _measure(
                checkpoint, dataset, predictions, split, tuple(segment_by), save_predictions,
                tuple(keep),
                baselines, smoothing, batch_size, num_bins, exact_limit, ece_bins, progress,
                group, rank, world_size, staging,
            )
            if checkpoint is not None:
                result.metrics.update(checkpoint_status(checkpoint))
            result.gates = check_gates(parsed, result.metrics)
            if rank == 0:
                _write(staging, result)
                publish_staged(staging, out)
                result.out = out
                result.run_id = _track(tracker, out, result, checkpoint, split, parsed)
    except BaseException:
        if rank == 0:
            shutil.rmtree(staging, ignore_errors=True)
        raise
    for gate in result.gates if rank == 0 else ():
        logger.debug("gate %s", gate.describe())
    if gates_raise:
        raise_for_failures(result.gates)
    return result


def gates_from_output(out: str | Path, exit_code: int) -> list[GateResult]:
    """After the ranks of a launched evaluation ended: raise for a failed run or gate.

    Raises:
        DistributedError: a rank failed (``exit_code`` non-zero) before writing the outputs.
        GateError: ``out/gates.json`` records a failed gate.
    """
    out = Path(out)
    if exit_code != 0 or not (out / "gates.json").is_file():
        raise DistributedError(
            f"the evaluation processes failed (exit code {exit_code})",
            where=str(out),
            hint="the first error in the log above names the rank and the cause",
        )
    results = []
    for item in json.loads((out / "gates.json").read_text()):
        gate = parse_gates([item["gate"]])[0]
        results.append(GateResult(gate, item["actual"], item["passed"], item["margin"]))
    raise_for_failures(results)
    return results


def _measure(
    checkpoint: Path | None, dataset: Path | None, predictions: Path | None, split: str,
    segment_by: tuple[str, ...], save_predictions: bool, keep: tuple[str, ...],
    with_baselines: bool,
    smoothing: float, batch_size: int, num_bins: int, exact_limit: int, ece_bins: int,
    progress: Progress, group: Any, rank: int, world_size: int, staging: Path,
) -> EvalResult:
    manifest = DatasetManifest.load(dataset) if dataset is not None else None
    total = manifest.split(split).rows if manifest is not None else None
    acc = CTRMetrics(num_bins=num_bins, exact_limit=exact_limit, ece_bins=ece_bins,
                     process_group=group)
    segments = {f: SegmentAccumulator(f, exact_limit=exact_limit) for f in segment_by}
    writer = _PredictionWriter(staging / "predictions", rank) if save_predictions else None
    wanted = tuple(dict.fromkeys((*segment_by, *(keep if writer is not None else ()))))
    # The split position of this rank's first row (ranks score consecutive ranges).
    next_row = rank_range(total, rank, world_size)[0] if total is not None and \
        checkpoint is not None else None
    progress.start(f"eval {split}", total=total // world_size if total else None, unit="rows")
    completed = False
    try:
        for batch in _scores(checkpoint, dataset, predictions, split, wanted, rank,
                             world_size, batch_size):
            acc.update(batch.labels, batch.scores, batch.weights)
            for feature, seg in segments.items():
                seg.update(batch.features[feature], batch.labels, batch.scores, batch.weights)
            if writer is not None:
                writer.write(batch, next_row)
            if next_row is not None:
                next_row += len(batch)
            progress.advance(len(batch))
        completed = True
    finally:
        if writer is not None:
            writer.close()
        progress.finish(completed)
    for seg in segments.values():
        seg.sync(group)
    details = acc.compute()  # synced over the ranks of group
    if details.rows == 0:
        raise DatasetError(f"nothing to evaluate: split {split!r} has no rows",
                           where=str(predictions or dataset),
                           hint="evaluate a split (or predictions file) that holds rows")
    baseline_rows: list[dict[str, Any]] = []
    if with_baselines and manifest is not None and dataset is not None and "train" in (
        manifest.splits
    ):
        baseline_rows.append(
            base_rate_baseline(manifest.splits["train"].label_rate, details.weight,
                               details.positives)
        )
        if details.weight == details.rows:  # unweighted rows: the baselines score the same
            baseline_rows += feature_ctr_baselines(
                dataset, split, smoothing=smoothing, rank=rank, world_size=world_size,
                exact_limit=exact_limit, group=group,
            )
    context = {
        "split": split,
        "checkpoint": str(checkpoint) if checkpoint else None,
        "dataset": str(dataset) if dataset else None,
        "predictions": str(predictions) if predictions else None,
        "world_size": world_size,
    }
    return EvalResult(
        metrics=_flat_metrics(details, baseline_rows, context, num_bins, ece_bins),
        details=details,
        segments={f: seg.compute() for f, seg in segments.items()},
        baselines=baseline_rows,
    )


def _write(staging: Path, result: EvalResult) -> None:
    from ctrctl.evaluation.plots import reliability_plot, score_histogram_plot

    details = result.details
    write_json_atomic(staging / "metrics.json", result.metrics)
    write_json_atomic(staging / "reliability.json", [b.to_dict() for b in details.reliability])
    write_json_atomic(staging / "score_histogram.json", details.histogram)
    write_json_atomic(staging / "baselines.json", result.baselines)
    write_json_atomic(staging / "gates.json", [g.to_dict() for g in result.gates])
    if details.reliability:
        reliability_plot(details.reliability, staging / "reliability.png")
    score_histogram_plot(details.histogram, staging / "scores.png")
    if result.segments:
        folder = staging / "segments"
        folder.mkdir()
        for feature, rows in result.segments.items():
            write_json_atomic(folder / f"{feature}.json", rows)
            write_csv(folder / f"{feature}.csv", rows)


def _track(
    tracker: Tracker, out: Path, result: EvalResult, checkpoint: Path | None, split: str,
    gates: Sequence[Gate],
) -> str | None:
    tags = {"ctrctl.split": split}
    parent = training_run_id(checkpoint)
    if parent:
        tags["ctrctl.training_run_id"] = parent
    with tracker.run("eval", tags=tags) as run:
        run.log_params({
            "split": split,
            "checkpoint": str(checkpoint) if checkpoint else "",
            "dataset": result.metrics.get("dataset") or "",
            "predictions": result.metrics.get("predictions") or "",
            "num_bins": result.metrics["num_bins"],
            "ece_bins": result.metrics["ece_bins"],
            "gates": ", ".join(str(g) for g in gates),
        })
        run.log_metrics({k: v for k, v in result.metrics.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool)})
        for feature, rows in result.segments.items():
            run.log_metrics({f"segment.{feature}.{r['segment']}.auc": r["auc"]
                             for r in rows[:50] if r["auc"] is not None})
        for name in ("metrics.json", "reliability.png", "scores.png"):
            if (out / name).is_file():
                run.log_artifact(out / name)
        for name in ("segments",):
            if (out / name).is_dir():
                run.log_artifact(out / name, name)
        run.log_artifact(out / "baselines.json")
        run.log_artifact(out / "gates.json")
        run.set_tags({"ctrctl.gates": "passed" if result.passed else "failed"})
        return run.run_id
