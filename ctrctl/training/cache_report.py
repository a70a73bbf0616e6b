"""What the caches of cached tables did in a run: MLflow metrics and a table for the log.

Every embedding collection in the model (found inside wrappers such as DDP or DMP) that
exposes ``cache_stats()`` contributes one block of metrics per cached table::

    cache.<table>.hit_rate           1 - unique_misses / unique_ids (distinct ids per lookup)
    cache.<table>.calls              lookups (one per batch, prefetched or inline)
    cache.<table>.requested_ids      ids asked for, repeats included
    cache.<table>.unique_ids         distinct ids per lookup, summed over lookups
    cache.<table>.unique_misses      of those, found in no slot (read from the file or
                                     initialised from (seed, row id))
    cache.<table>.conflict_misses    misses whose set had no unlocked way (overflow slots)
    cache.<table>.forward_misses     misses of lookups a forward did inline (0 when every
                                     batch was prefetched)
    cache.<table>.rows_written_back  dirty rows written to the file (evictions, flushes)
    cache.<table>.bytes_read         bytes read from the file / written to it
    cache.<table>.bytes_written
    cache.<table>.dram_bytes         memory the cache holds now (slots, metadata)
    cache.<table>.prefetch_seconds   seconds of its lookups on the prefetch worker
    cache.<table>.inline_lookup_seconds  seconds of its lookups inside forwards

and, once for the model, ``cache.prefetch_wait_seconds``: how long the training thread
waited for prefetches to finish. The counters are cumulative over the model's life
(training and validation batches both look up through the cache); ``hit_rate`` is left out
while a table has had no lookup.

Example:
    >>> metrics = cache_metrics(model)          # {} when no table is cached
    >>> run.log_metrics(metrics, step=step)
    >>> logger.info("cached tables:\\n%s", format_cache_report(metrics))
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch.distributed as dist
from torch import nn

from ctrctl.modules.cached_embedding import CachedEmbeddingBag

__all__ = ["cache_metrics", "format_cache_report", "gather_cache_metrics"]

PREFIX = "cache."
#: The model-wide metric (not per table).
WAIT_METRIC = "cache.prefetch_wait_seconds"


@runtime_checkable
class _HasCacheStats(Protocol):
    def cache_stats(self) -> dict[str, dict[str, float]]: ...


def _collections(model: nn.Module) -> list[_HasCacheStats]:
    """Outermost modules with ``cache_stats()``: a collection's kernels are not counted twice."""
    found: list[str] = []
    out: list[_HasCacheStats] = []
    for name, module in model.named_modules():
        if any(name.startswith(f + ".") or f == "" for f in found):
            continue
        if isinstance(module, _HasCacheStats):
            found.append(name)
            out.append(module)
    return out


def cache_metrics(model: nn.Module) -> dict[str, float]:
    """Flat, MLflow-ready metrics of every cached table in ``model`` (see the module's doc).

    Args:
        model: the model, possibly wrapped (DDP, DMP: anything that holds it as a submodule).

    Returns:
        ``cache.<table>.<counter>`` for each cached table, plus ``cache.prefetch_wait_seconds``;
        empty when no table is cached.
    """
    metrics: dict[str, float] = {}
    for collection in _collections(model):
        for table, stats in sorted(collection.cache_stats().items()):
            base = f"{PREFIX}{table}."
            for key, value in stats.items():
                metrics[base + key] = float(value)
            if stats.get("unique_ids", 0) > 0:
                metrics[base + "hit_rate"] = 1.0 - stats["unique_misses"] / stats["unique_ids"]
    if metrics:
        metrics[WAIT_METRIC] = float(sum(
            m.prefetch_wait_seconds for m in model.modules() if isinstance(m, CachedEmbeddingBag)))
    return metrics


def _tables(metrics: dict[str, float]) -> list[str]:
    names = {k[len(PREFIX):].rsplit(".", 1)[0] for k in metrics
             if k.startswith(PREFIX) and k != WAIT_METRIC}
    return sorted(names)


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def format_cache_report(metrics: dict[str, float]) -> str:
    """A short table of :func:`cache_metrics`, one line per cached table ("" when none).

    Columns: hit rate, lookups, unique ids, misses (of them conflicts and forward misses),
    rows written back, bytes read / written, DRAM, prefetch seconds; then the wait.
    """
    tables = _tables(metrics)
    if not tables:
        return ""
    header = ("table", "hit rate", "lookups", "unique ids", "misses", "conflict", "fwd miss",
              "written back", "read", "written", "DRAM", "prefetch s")
    rows = []
    for t in tables:
        m = {k[len(PREFIX) + len(t) + 1:]: v for k, v in metrics.items()
             if k.startswith(f"{PREFIX}{t}.")}
        hit = m.get("hit_rate")
        rows.append((
            t, "-" if hit is None else f"{hit:.3f}",
            f"{m.get('calls', 0):,.0f}", f"{m.get('unique_ids', 0):,.0f}",
            f"{m.get('unique_misses', 0):,.0f}", f"{m.get('conflict_misses', 0):,.0f}",
            f"{m.get('forward_misses', 0):,.0f}", f"{m.get('rows_written_back', 0):,.0f}",
            _size(m.get("bytes_read", 0)), _size(m.get("bytes_written", 0)),
            _size(m.get("dram_bytes", 0)), f"{m.get('prefetch_seconds', 0):.2f}",
        ))
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in [header, *rows]]
    lines.append(f"waited for prefetches: {metrics.get(WAIT_METRIC, 0.0):.2f} s")
    return "\n".join(lines)


def gather_cache_metrics(model: nn.Module, world_size: int) -> dict[str, float]:
    """Every rank's cached tables (or shards) in one dict; the waits summed over ranks."""
    mine = cache_metrics(model)
    if world_size == 1:
        return mine
    every: list[Any] = [None] * world_size
    dist.all_gather_object(every, mine)
    merged: dict[str, float] = {}
    for metrics in every:
        for key, value in metrics.items():
            merged[key] = merged.get(key, 0.0) + value if key == WAIT_METRIC else value
    return merged
