"""``ctrctl monitor``: drift, calibration and alarms for a model on new or served rows.

Computes, against the model's training split statistics:

- per feature: PSI (dense over the training quantile bins, sparse over the training top-K
  ids plus ``other``), the missing rate of the raw values (request logs), the
  out-of-vocabulary (default row) rate of vocabulary features, the share of ids outside the
  training top-K;
- the scores' shift: PSI over the training score bins when the reference has them, and the
  mean score against the training label rate;
- on labelled rows: AUC, logloss, calibration (predicted / observed clicks), ECE and the
  reliability diagram, overall and per segment (``--segment-by``);
- staleness: the age in seconds of the newest row of each source.

Writes ``metrics.json``, ``reliability.png`` and ``psi.png`` into OUT, logs an MLflow run
tagged with the model's name and version, and checks ``--gate``s: a breach raises
:class:`~ctrctl.errors.GateError` (exit code 3) after everything is written.

Gate names: ``psi.max``, ``psi.mean``, ``score.psi``, ``score.mean_shift``, ``missing.max``,
``default_rate.max``, ``staleness_s.max``, ``auc``, ``logloss``, ``calibration``, ``ece``,
``rows``, ``labelled_rows``.

Example:
    >>> result = monitor("export", "out", requests="logs", labels="clicks.parquet",
    ...                  gates=["psi.max<=0.2", "calibration=1.0+-0.1"])
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctrctl.errors import ConfigError
from ctrctl.evaluation.gates import check_gates, parse_gates, raise_for_failures
from ctrctl.io import write_json_atomic, writing
from ctrctl.metrics.calibration import expected_calibration_error, reliability_table
from ctrctl.metrics.functional import MetricError, calibration_ratio, log_loss, roc_auc
from ctrctl.monitoring.drift import dense_drift, sparse_drift
from ctrctl.monitoring.sources import (
    MonitoredModel,
    Rows,
    resolve_model,
    rows_from_dataset,
    rows_from_requests,
)
from ctrctl.tracking import Tracker

__all__ = ["MONITOR_GATES", "MonitorResult", "labelled_metrics", "monitor"]

logger = logging.getLogger(__name__)

MONITOR_GATES = ("psi.max", "psi.mean", "score.psi", "score.mean_shift", "missing.max",
                 "default_rate.max", "staleness_s.max", "auc", "logloss", "calibration",
                 "ece", "rows", "labelled_rows")
#: Segments reported by name (the most frequent); the rest are left out of ``segments``.
MAX_SEGMENTS = 20
ECE_BINS = 10


@dataclass(frozen=True)
class MonitorResult:
    """What :func:`monitor` measured and wrote."""

    out: Path
    metrics: dict[str, Any]
    gates: list[dict[str, Any]]
    run_id: str | None


def _maybe(fn: Any, *args: Any) -> float | None:
    try:
        return float(fn(*args))
    except MetricError:
        return None  # e.g. AUC of rows with one class


def labelled_metrics(labels: np.ndarray, scores: np.ndarray, bins: int = ECE_BINS
                     ) -> dict[str, Any]:
    """AUC, logloss, calibration, ECE and the reliability bins of labelled rows."""
    if labels.size == 0:
        return {"rows": 0, "auc": None, "logloss": None, "calibration": None, "ece": None,
                "label_rate": None, "mean_score": None, "reliability": []}
    table = reliability_table(labels, scores, n_bins=bins)
    return {"rows": int(labels.size), "auc": _maybe(roc_auc, labels, scores),
            "logloss": _maybe(log_loss, labels, scores),
            "calibration": _maybe(calibration_ratio, labels, scores),
            "ece": _maybe(expected_calibration_error, table),
            "label_rate": float(labels.mean()), "mean_score": float(scores.mean()),
            "reliability": [b.to_dict() for b in table]}


def _segments(rows: Rows) -> dict[str, Any]:
    if rows.segments is None:
        return {}
    values, counts = np.unique(rows.segments.astype(str), return_counts=True)
    keep = values[np.argsort(-counts, kind="stable")][:MAX_SEGMENTS]
    out = {}
    for value in keep:
        mask = rows.segments.astype(str) == value
        entry = labelled_metrics(rows.labels[mask], rows.scores[mask])
        entry.pop("reliability")
        out[str(value)] = entry
    return out


def _drift(model: MonitoredModel, rows: Rows) -> dict[str, Any]:
    ref = model.reference
    features: dict[str, Any] = {}
    for name, values in rows.dense.items():
        if name in ref.get("dense", {}):
            features[name] = {"kind": "dense", **dense_drift(ref["dense"][name], values)}
    for name, ids in rows.sparse.items():
        if name in ref.get("sparse", {}):
            features[name] = {"kind": "sparse", **sparse_drift(ref["sparse"][name], ids)}
    for name, rate in rows.missing.items():
        features.setdefault(name, {"kind": "raw"})["missing_rate"] = rate
    psis = {n: f["psi"] for n, f in features.items() if "psi" in f}
    worst = max(psis, key=lambda n: psis[n]) if psis else None
    scores = rows.all_scores.astype(np.float64)
    score: dict[str, Any] = {"mean": float(scores.mean()) if scores.size else None,
                             "mean_shift": (float(scores.mean()) - ref["label_rate"])
                             if scores.size else None, "psi": None}
    if "score" in ref and scores.size:
        score["psi"] = dense_drift(ref["score"], scores)["psi"]
    defaults = [f["default_rate"] for f in features.values()
                if f.get("default_rate") is not None]
    return {"features": features, "score": score,
            "psi": {"max": psis[worst] if worst else None, "max_feature": worst,
                    "mean": float(np.mean(list(psis.values()))) if psis else None},
            "missing": {"max": max(rows.missing.values()) if rows.missing else None},
            "default_rate": {"max": max(defaults) if defaults else None}}


def _flat_for_gates(metrics: dict[str, Any]) -> dict[str, Any]:
    flat = {k: metrics.get(k) for k in ("auc", "logloss", "calibration", "ece", "rows",
                                        "labelled_rows")}
    for group in ("psi", "score", "missing", "default_rate"):
        for key, value in metrics.get(group, {}).items():
            flat[f"{group}.{key}"] = value
    ages = [v for v in metrics.get("staleness_s", {}).values() if v is not None]
    flat["staleness_s.max"] = max(ages) if ages else None
    return flat


def _plots(metrics: dict[str, Any], out: Path) -> list[Path]:
    from ctrctl.evaluation.plots import _figure, reliability_plot
    from ctrctl.metrics.calibration import ReliabilityBin

    written = []
    if metrics["reliability"]:
        bins = [ReliabilityBin(**b) for b in metrics["reliability"]]
        written.append(reliability_plot(bins, out / "reliability.png",
                                        "Reliability on labelled rows"))
    psis = {n: f["psi"] for n, f in metrics["features"].items() if f.get("psi") is not None}
    if psis:
        fig, ax = _figure(7, 0.25 * len(psis) + 1.5)
        names = sorted(psis, key=lambda n: psis[n])
        ax.barh(names, [psis[n] for n in names])
        for x, style in ((0.1, ":"), (0.25, "--")):
            ax.axvline(x, color="grey", linestyle=style, linewidth=1)
        ax.set_xlabel("PSI against the training split")
        ax.set_title("Feature drift")
        fig.tight_layout()
        fig.savefig(out / "psi.png", dpi=110)
        written.append(out / "psi.png")
    return written


def monitor(model: str, out: str | Path, *, dataset: str | Path | None = None,
            split: str | None = None, requests: str | Path | None = None,
            labels: str | Path | None = None, segment_by: str | None = None,
            gates: Sequence[str] = (), tracker: Tracker | None = None,
            tracking_uri: str | None = None) -> MonitorResult:
    """Judge ``model`` on a dataset split or on served traffic joined with labels.

    Args:
        model: a checkpoint, an export folder or ``models:/NAME@ALIAS``.
        out: the folder for ``metrics.json`` and the plots.
        dataset, split: a preprocessed split (offline), or
        requests, labels: ``ctrctl serve``'s log folder and a Parquet of (request_id, row,
            label).
        segment_by: a feature whose values cut the labelled rows into segments.
        gates: e.g. ``psi.max<=0.2``, ``calibration=1.0+-0.1`` (:data:`MONITOR_GATES`).
        tracker: where the run is logged (tagged with the model's name and version).

    Raises:
        GateError: a gate failed (after metrics.json is written).
    """
    parsed = parse_gates(gates, MONITOR_GATES)  # a bad gate fails before any work
    if (dataset is None) == (requests is None) or (dataset is not None and split is None) \
            or (requests is not None and labels is None):
        raise ConfigError("give either --dataset and --split, or --requests and --labels",
                          where="ctrctl monitor")
    out = Path(out)
    watched = resolve_model(model, tracking_uri)
    rows = (rows_from_dataset(watched, dataset, split or "", segment_by) if dataset is not None
            else rows_from_requests(watched, requests or "", labels or "", segment_by))
    labelled = labelled_metrics(rows.labels, rows.scores)
    metrics: dict[str, Any] = {
        "model": {"uri": watched.uri, "kind": watched.kind, "name": watched.name,
                  "version": watched.version, "folder": str(watched.folder)},
        "source": {"dataset": str(dataset), "split": split} if dataset is not None else
        {"requests": str(requests), "labels": str(labels)},
        "rows": int(rows.all_scores.size), "labelled_rows": labelled.pop("rows"),
        **labelled, **_drift(watched, rows), "staleness_s": rows.staleness_s,
        "join": rows.join, "segment_by": segment_by, "segments": _segments(rows)}
    results = check_gates(parsed, _flat_for_gates(metrics))
    metrics["gates"] = [r.to_dict() for r in results]
    tracker = tracker or Tracker()
    with writing(out), tracker.run("monitor", tags={
            "ctrctl.model.uri": watched.uri, "ctrctl.model.name": watched.name,
            "ctrctl.model.version": watched.version}) as run:
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "metrics.json", metrics)
        plots = _plots(metrics, out)
        run.log_metrics({f"monitor.{k}": float(v) for k, v in _flat_for_gates(metrics).items()
                         if isinstance(v, int | float)})
        run.log_artifact(out / "metrics.json")
        for plot in plots:
            run.log_artifact(plot, "plots")
        run_id = run.run_id
    if watched.registered and run_id:
        _link_version(watched, run_id, tracking_uri)
    raise_for_failures(results)
    return MonitorResult(out, metrics, metrics["gates"], run_id)


def _link_version(model: MonitoredModel, run_id: str, tracking_uri: str | None) -> None:
    """Tag the registered version with its latest monitoring run."""
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(tracking_uri=tracking_uri).set_model_version_tag(
            model.name, model.version, "ctrctl.monitor.run_id", run_id)
    except Exception as exc:  # the run is logged; a tag the store refuses is not fatal
        logger.warning("could not tag version %s of %s: %s", model.version, model.name, exc)
