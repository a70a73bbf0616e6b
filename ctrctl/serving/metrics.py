"""The server's Prometheus metrics (prometheus-client, text format at ``GET /metrics``).

One :class:`Metrics` per app, on its own registry (several apps in one process, as in the
tests, do not collide). With several worker processes prometheus-client's multiprocess mode
is used (``PROMETHEUS_MULTIPROC_DIR``, set by :func:`ctrctl.serving.server.serve` before the
workers start): every worker writes its values to files there and ``/metrics`` sums them.

Names::

    ctrctl_request_duration_seconds{endpoint,status,model_version}   histogram
    ctrctl_requests_total{endpoint,status,model_version}            counter
    ctrctl_queue_wait_seconds{model_version}                        histogram
    ctrctl_batch_rows{model_version}                                histogram
    ctrctl_shed_total{reason}                                       counter (queue_full,
                                                                    deadline, timeout, not_ready)
    ctrctl_score{model_version}                                     histogram
    ctrctl_feature_values_total{feature}                            counter
    ctrctl_feature_missing_total{feature}                           counter (rate: / values)
    ctrctl_feature_oov_total{feature}                               counter (vocabulary features)
    ctrctl_zch_default_lookups_total{feature}                       counter (zch features)
    ctrctl_zch_occupancy{feature,model_version}                     gauge (share of rows owned)
    ctrctl_log_rows_total / ctrctl_log_dropped_total                counters
    ctrctl_model_info{role,model_version}                           gauge (1 = serving)
    ctrctl_reload_failures_total{role}                              counter (a new version
                                                                    that failed to load)
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

LATENCY_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
                   0.1, 0.2, 0.5, 1.0, 2.5, 5.0)
ROW_BUCKETS = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
SCORE_BUCKETS = tuple(i / 20 for i in range(1, 20)) + (0.99,)


class BulkHistogram(Histogram):
    """A :class:`~prometheus_client.Histogram` that also takes many values in one call.

    :meth:`observe_many` counts the values per bucket with numpy (``searchsorted`` on the
    bounds) and adds each bucket's count once, and their sum once: the same buckets,
    ``_sum`` and ``_count`` as :meth:`observe` of each value (the sum up to the order of
    the float additions), for a few bucket updates instead of one call per value. It works
    in multiprocess mode too: the updates go to the same per-bucket values.

    Example:
        >>> scores = BulkHistogram("score", "Scores.", ["model_version"], buckets=(0.5, 1.0))
        >>> scores.labels("3").observe_many(np.array([0.2, 0.7, 0.9]))  # le=0.5: 1, le=1.0: 3
    """

    def _metric_init(self) -> None:
        super()._metric_init()
        # observe() puts a value in the first bucket whose bound is >= it: searchsorted's
        # "left" side; a NaN sorts after +Inf and is counted in no bucket, as by observe()
        self._bounds = np.asarray(self._upper_bounds, dtype=np.float64)

    def observe_many(self, values: Any) -> None:
        """Observe every value of ``values`` (an array or a sequence of floats)."""
        self._raise_if_not_observable()
        array = np.asarray(values, dtype=np.float64).reshape(-1)
        if not array.size:
            return
        bucket = np.searchsorted(self._bounds, array, side="left")
        counts = np.bincount(bucket, minlength=len(self._bounds))[:len(self._bounds)]
        self._sum.inc(float(array.sum()))
        for i in np.flatnonzero(counts).tolist():
            self._buckets[i].inc(float(counts[i]))


def multiprocess() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class Metrics:
    """The server's metrics on one registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.duration = Histogram("ctrctl_request_duration_seconds", "Request latency.",
                                  ["endpoint", "status", "model_version"],
                                  buckets=LATENCY_BUCKETS, registry=r)
        self.requests = Counter("ctrctl_requests", "Requests answered.",
                                ["endpoint", "status", "model_version"], registry=r)
        self.queue_wait = Histogram("ctrctl_queue_wait_seconds",
                                    "Time from arrival to the start of the batch that scored "
                                    "the request.", ["model_version"],
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.batch_rows = Histogram("ctrctl_batch_rows", "Rows per model call.",
                                    ["model_version"], buckets=ROW_BUCKETS, registry=r)
        self.shed = Counter("ctrctl_shed", "Requests refused with 503 (queue full or deadline).",
                            ["reason"], registry=r)
        self.score = BulkHistogram("ctrctl_score", "Scores returned.", ["model_version"],
                               buckets=SCORE_BUCKETS, registry=r)
        self.feature_values = Counter("ctrctl_feature_values", "Rows seen per feature.",
                                      ["feature"], registry=r)
        self.feature_missing = Counter("ctrctl_feature_missing",
                                       "Rows where the feature was absent or null.",
                                       ["feature"], registry=r)
        self.feature_oov = Counter("ctrctl_feature_oov", "Rows whose value of a vocabulary "
                                   "feature is not in the vocabulary.", ["feature"],
                                   registry=r)
        self.zch_default = Counter("ctrctl_zch_default_lookups", "Keys of a managed-"
                                   "collision feature that own no row (scored with the "
                                   "shared default row).", ["feature"], registry=r)
        self.zch_occupancy = Gauge("ctrctl_zch_occupancy", "Share of a managed-collision "
                                   "table's rows (the default row aside) owned by a key in "
                                   "the serving artifact.", ["feature", "model_version"],
                                   registry=r, multiprocess_mode="max")
        self.log_rows = Counter("ctrctl_log_rows", "Rows written to the request log.",
                                registry=r)
        self.log_dropped = Counter("ctrctl_log_dropped", "Rows the request log dropped "
                                   "(queue full, or the disk refused them).", registry=r)
        self.model_info = Gauge("ctrctl_model_info", "Model versions serving (1) by role.",
                                ["role", "model_version"], registry=r,
                                multiprocess_mode="liveall")
        self.reload_failures = Counter("ctrctl_reload_failures", "Hot reloads that failed "
                                       "(the alias unresolvable, or its new version failed "
                                       "to load); the old version kept serving.", ["role"],
                                       registry=r)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        if multiprocess():
            from prometheus_client import multiprocess as mp

            registry = CollectorRegistry()
            mp.MultiProcessCollector(registry)
            return generate_latest(registry), CONTENT_TYPE_LATEST
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
