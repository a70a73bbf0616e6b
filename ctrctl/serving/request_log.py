"""The request log: every scored row, appended by a background thread to rotating Parquet files.

A request hands its rows to a bounded queue and returns; a thread turns them into Parquet
files under the log folder, one file per ``rotate_rows`` rows or ``rotate_s`` seconds,
each written to a temporary name and renamed (a reader never sees half a file)::

    requests-<UTC time>-<pid>-<seq>.parquet
        request_id  string      the request's id (the X-Request-Id header, or a new one)
        time        timestamp   when the request was scored (UTC, microseconds)
        model_version string
        score       float64
        <feature>   string      the raw value as sent (null when absent), one per input column

A full queue, a full disk or an unwritable folder drops rows and counts them
(``ctrctl_log_dropped_total``); a request never fails because of the log.

Example:
    >>> log = RequestLog("logs", ["I1", "C1"], metrics)
    >>> log.append("r1", "3", {"I1": ["3"], "C1": ["ab"]}, [0.03])
    >>> log.close()                                        # flushes what is queued
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ctrctl.serving.metrics import Metrics

logger = logging.getLogger(__name__)

_STOP = object()


class RequestLog:
    """Bounded background writer of rotating Parquet files.

    Args:
        folder: where the files go (created).
        columns: the raw input columns logged, in order.
        metrics: counts written and dropped rows.
        max_queue: requests waiting to be written; beyond it rows are dropped.
        rotate_rows, rotate_s: a file is closed after this many rows or seconds.
    """

    def __init__(self, folder: str | Path, columns: Sequence[str], metrics: Metrics, *,
                 max_queue: int = 1024, rotate_rows: int = 100_000,
                 rotate_s: float = 60.0) -> None:
        self.folder = Path(folder)
        self.columns = list(columns)
        self.metrics = metrics
        self.rotate_rows = rotate_rows
        self.rotate_s = rotate_s
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queue)
        self._pending: list[tuple[str, float, str, Mapping[str, Sequence[Any]],
                                  Sequence[float]]] = []
        self._pending_rows = 0
        self._opened = time.monotonic()
        self._seq = 0
        self.dropped = 0
        self.written = 0
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            logger.warning("request log folder %s cannot be created (%s): rows are dropped",
                           self.folder, exc.strerror)
        self._thread = threading.Thread(target=self._run, name="ctrctl-request-log",
                                        daemon=True)
        self._thread.start()

    def append(self, request_id: str, model_version: str,
               columns: Mapping[str, Sequence[Any]], scores: Sequence[float]) -> None:
        """Queue one request's rows; never blocks, never raises."""
        try:
            self._queue.put_nowait((request_id, time.time(), model_version, columns, scores))
        except queue.Full:
            self._drop(len(scores))

    def close(self, timeout: float = 30.0) -> None:
        """Write everything queued, then stop the thread."""
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)

    def _drop(self, rows: int) -> None:
        self.dropped += rows
        self.metrics.log_dropped.inc(rows)

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=min(1.0, self.rotate_s))
            except queue.Empty:
                item = None
            if item is _STOP:
                self._flush()
                return
            if item is not None:
                self._pending.append(item)
                self._pending_rows += len(item[4])
            due = time.monotonic() - self._opened >= self.rotate_s
            if self._pending_rows >= self.rotate_rows or (due and self._pending):
                self._flush()

    def _table(self) -> pa.Table:
        ids: list[str] = []
        times: list[float] = []
        versions: list[str] = []
        scores: list[float] = []
        raw: dict[str, list[Any]] = {c: [] for c in self.columns}
        for request_id, when, version, columns, request_scores in self._pending:
            n = len(request_scores)
            ids.extend([request_id] * n)
            times.extend([when] * n)
            versions.extend([version] * n)
            scores.extend(float(s) for s in request_scores)
            for name, out in raw.items():
                values = columns.get(name)
                if values is None:
                    out.extend([None] * n)
                else:
                    out.extend(None if v is None else str(v) for v in values)
        stamps = pa.array([int(t * 1e6) for t in times], pa.timestamp("us", tz="UTC"))
        data = {"request_id": pa.array(ids, pa.string()), "time": stamps,
                "model_version": pa.array(versions, pa.string()),
                "score": pa.array(scores, pa.float64())}
        data.update({name: pa.array(values, pa.string()) for name, values in raw.items()})
        return pa.table(data)

    def _flush(self) -> None:
        rows = self._pending_rows
        self._opened = time.monotonic()
        if not rows:
            self._pending = []
            return
        try:
            table = self._table()
            stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
            name = f"requests-{stamp}-{os.getpid()}-{self._seq:05d}.parquet"
            final = self.folder / name
            temp = self.folder / f".{name}.tmp"
            try:
                pq.write_table(table, temp)
                os.replace(temp, final)
            finally:
                temp.unlink(missing_ok=True)
            self._seq += 1
            self.written += rows
            self.metrics.log_rows.inc(rows)
        except (OSError, pa.ArrowException) as exc:
            logger.warning("request log: %d rows dropped (%s)", rows, exc)
            self._drop(rows)
        finally:
            self._pending = []
            self._pending_rows = 0
