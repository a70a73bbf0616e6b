"""Metrics of click predictions: the exact functions, and streaming torchmetrics ``Metric``s.

- :mod:`ctrctl.metrics.functional`: exact, sort-based AUC, PR-AUC, logloss, NE, calibration
  ratio on whole arrays (the reference; they match scikit-learn);
- :mod:`ctrctl.metrics.calibration`: equal-mass reliability bins and ECE;
- :mod:`ctrctl.metrics.streaming`: the same as torchmetrics ``Metric`` subclasses with
  distributed sync (:class:`CTRMetrics`, :class:`StreamingAUC`, :class:`Calibration`,
  :class:`NormalizedEntropy`, :class:`ExpectedCalibrationError`, :class:`LogLoss`), used by
  ``ctrctl eval`` and training's validation alike.

Pure metric math: nothing here knows datasets, models or the CLI (training may import it).

Example:
    >>> from ctrctl.metrics import CTRMetrics, roc_auc
    >>> roc_auc(labels, scores)                           # exact
    >>> m = CTRMetrics(); m.update(labels, scores); m.compute().auc_bound
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> module; loaded on first use, so that the pure functions (used by
#: ``ctrctl synth``) do not import torchmetrics.
_EXPORTS: dict[str, str] = {
    **{name: "ctrctl.metrics.calibration" for name in (
        "ReliabilityBin", "expected_calibration_error", "reliability_table")},
    **{name: "ctrctl.metrics.functional" for name in (
        "MetricError", "average_precision", "calibration_ratio", "log_loss",
        "normalized_entropy", "roc_auc")},
    **{name: "ctrctl.metrics.streaming" for name in (
        "CTRMetrics", "Calibration", "ExpectedCalibrationError", "LogLoss", "Metrics",
        "NormalizedEntropy", "ScoreHistogram", "ScoreMetric", "StreamingAUC")},
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ctrctl.metrics' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
