"""A Chrome trace of a train pipeline's stages: which stage ran when, on which thread, per step.

Each rank records spans (name, thread, start, duration, step) as it runs;
:func:`write_trace` gathers every rank's spans to rank 0, which writes one JSON file in the
Trace Event Format (``chrome://tracing`` or https://ui.perfetto.dev open it): one process per
rank, one track per thread (the main loop, the loading thread, the embedding worker).

Example:
    >>> tracer = Tracer()
    >>> with tracer.span("forward", step=3):
    ...     logits = model(batch.dense, batch.sparse)
    >>> write_trace("trace.json", tracer)
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ctrctl.io import write_json_atomic

__all__ = ["Tracer", "write_trace"]


class Tracer:
    """Records spans of this process; a disabled tracer records nothing and costs nothing.

    Args:
        enabled: record (False: :meth:`span` is a no-op).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._origin = time.perf_counter()

    @contextlib.contextmanager
    def span(self, name: str, step: int | None = None) -> Iterator[None]:
        """Time the block as one event named ``name`` (of ``step``) on this thread's track."""
        if not self.enabled:
            yield
            return
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            event = {"name": name, "ph": "X", "ts": (start - self._origin) * 1e6,
                     "dur": (end - start) * 1e6, "tid": threading.current_thread().name,
                     "args": {} if step is None else {"step": step}}
            with self._lock:
                self.events.append(event)

    def totals(self) -> dict[str, float]:
        """Seconds spent per span name (summed over steps and threads)."""
        out: dict[str, float] = {}
        with self._lock:
            for e in self.events:
                out[e["name"]] = out.get(e["name"], 0.0) + e["dur"] / 1e6
        return out


def write_trace(path: str | Path, tracer: Tracer, group: Any | None = None) -> Path | None:
    """Gather every rank's spans and write them (rank 0) as one Chrome trace; returns the path
    on rank 0, None elsewhere. Every rank of ``group`` must call it."""
    events = list(tracer.events)
    rank, world = 0, 1
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(group), dist.get_world_size(group)
    gathered: list[Any] = [events]
    if world > 1:
        gathered = [None] * world
        dist.all_gather_object(gathered, events, group=group)
    if rank != 0:
        return None
    trace: list[dict[str, Any]] = []
    for r, rank_events in enumerate(gathered):
        threads: dict[str, int] = {}
        trace.append({"name": "process_name", "ph": "M", "pid": r, "tid": 0,
                      "args": {"name": f"rank {r}"}})
        for e in rank_events or []:
            tid = threads.setdefault(e["tid"], len(threads))
            trace.append({**e, "pid": r, "tid": tid})
        for name, tid in threads.items():
            trace.append({"name": "thread_name", "ph": "M", "pid": r, "tid": tid,
                          "args": {"name": name}})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"traceEvents": trace, "displayTimeUnit": "ms"})
    return path
