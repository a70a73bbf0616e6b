"""Evaluation of CTR scores: ranking (AUC, PR-AUC), loss (logloss, NE), calibration (ratio,
ECE, reliability), per segment, against baselines, with gates; streaming and distributed.

Example:
    >>> from ctrctl.evaluation import evaluate, roc_auc, CTRMetrics
    >>> roc_auc(labels, scores)                        # exact, ties count 1/2 (as sklearn)
    >>> m = CTRMetrics(); m.update(labels, scores); m.compute().auc_bound
    >>> evaluate("eval-out", checkpoint="runs/a", dataset="data", gates=["auc>=0.7"])
"""

from __future__ import annotations

from ctrctl.evaluation.evaluate import EvalResult, evaluate
from ctrctl.evaluation.gates import (
    Gate,
    GateResult,
    check_gates,
    gates_from_mapping,
    parse_gates,
)
from ctrctl.evaluation.segments import SegmentAccumulator
from ctrctl.metrics.calibration import (
    ReliabilityBin,
    expected_calibration_error,
    reliability_table,
)
from ctrctl.metrics.functional import (
    MetricError,
    average_precision,
    calibration_ratio,
    log_loss,
    normalized_entropy,
    roc_auc,
)
from ctrctl.metrics.streaming import CTRMetrics, Metrics, ScoreHistogram

__all__ = [
    "CTRMetrics",
    "EvalResult",
    "Gate",
    "GateResult",
    "MetricError",
    "Metrics",
    "ReliabilityBin",
    "ScoreHistogram",
    "SegmentAccumulator",
    "average_precision",
    "calibration_ratio",
    "check_gates",
    "evaluate",
    "expected_calibration_error",
    "gates_from_mapping",
    "log_loss",
    "normalized_entropy",
    "parse_gates",
    "reliability_table",
    "roc_auc",
]
