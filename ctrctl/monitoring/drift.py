"""Drift of features and scores against the training split's reference statistics.

The population stability index of a binned distribution ``e`` (reference shares) and ``a``
(observed shares) is ``sum_i (a_i - e_i) * ln(a_i / e_i)``, each share floored at
:data:`EPS` so an empty bin counts as a large, finite shift. Customary reading: below 0.1
stable, 0.1-0.25 moderate, above 0.25 a shift worth acting on.

- A dense feature is binned by the training quantiles (the reference's ``edges``).
- A sparse feature is binned as its training top-K ids plus one ``other`` bin.
- The scores are binned by the training scores' quantiles when the reference has them.

Example:
    >>> psi([0.5, 0.5], [0.5, 0.5])
    0.0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ctrctl.data.reference import bin_shares

__all__ = ["EPS", "dense_drift", "psi", "sparse_drift"]

#: Floor of a bin's share: an empty bin on one side gives a large but finite PSI.
EPS = 1e-4


def psi(expected: Sequence[float], actual: Sequence[float], eps: float = EPS) -> float:
    """The population stability index of two binned distributions (shares over the same bins)."""
    e = np.maximum(np.asarray(expected, dtype=np.float64), eps)
    a = np.maximum(np.asarray(actual, dtype=np.float64), eps)
    if e.shape != a.shape:
        raise ValueError(f"PSI over {e.size} and {a.size} bins")
    return float(np.sum((a - e) * np.log(a / e)))


def dense_drift(reference: Mapping[str, Any], values: np.ndarray) -> dict[str, Any]:
    """PSI of a dense feature's values over the training quantile bins, and their shares."""
    shares = bin_shares(values, reference["edges"])
    return {"psi": psi(reference["shares"], shares), "shares": shares,
            "mean": float(values.mean()) if values.size else None}


def sparse_drift(reference: Mapping[str, Any], ids: np.ndarray) -> dict[str, Any]:
    """PSI of a sparse feature's ids over the training top-K ids plus ``other``; the share of
    id 0 (the out-of-vocabulary row) for a vocabulary-mode feature."""
    top = list(reference["top"])
    n = max(1, ids.size)
    counts = [float(np.count_nonzero(ids == i)) / n for i in top]
    observed = [*counts, max(0.0, 1.0 - sum(counts))]
    expected = [*reference["shares"], reference["other"]]
    out: dict[str, Any] = {"psi": psi(expected, observed), "top_shares": counts,
                           "other": observed[-1],
                           "new_id_rate": observed[-1]}
    out["default_rate"] = (float(np.count_nonzero(ids == 0)) / n
                           if reference.get("default_rate") is not None else None)
    return out
