"""Dynamic batching: requests gathered into one model call, their scores split back.

A :class:`Batcher` serves one loaded model. Requests wait in a queue; the batcher takes the
oldest, then more until ``max_batch_rows`` rows or until the oldest has waited
``max_wait_s``, and runs them in one call on its compute thread: each request's raw
columns are encoded separately (a bad value fails its own request only), the inputs are
merged into one batch, scored by the exported program once, and the scores split back::

    requests  A (3 rows)   B (2 rows)   C (4 rows)
    merged    dense (9, F_dense)   lengths (F, 3 | 2 | 4) key-major   ids feature by feature
    scores    [a a a | b b | c c c c]  ->  A, B, C

Load is shed, not queued without limit: a request that would take the queue past
``max_queue_rows`` or could not be scored before its deadline (estimated from the queue
ahead of it: a measured fixed cost per model call plus a measured cost per row) is refused
at once with :class:`Overloaded` (a 503 with ``Retry-After``), and a request still queued at
its deadline is dropped the same way.

A request that reaches an idle batcher (nothing queued, nothing being scored, no batch ended
within ``max_wait_s``) is scored on the event loop's own thread, with no hop to the compute
thread and back: two thread wake-ups, which a busy machine makes cost milliseconds. The
loop is blocked for that one call; a request arriving meanwhile finds the batcher busy and
queues, so under load requests are batched as before.

Example:
    >>> batcher = Batcher(model, metrics, "3", max_batch_rows=2048, max_wait_s=0.002)
    >>> batcher.start()
    >>> scores = await batcher.submit({"I1": ["3"], "C1": ["ab"]}, 1, deadline)
    >>> await batcher.stop()                                 # drains the queue first
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ctrctl.serving import model_api
from ctrctl.serving.metrics import Metrics

#: Admit a request only if the estimate finishes it within this share of its time budget.
ADMIT_SHARE = 0.8
#: A batch of at most this many rows measures a model call's fixed cost; a larger one the
#: cost of its rows beyond it.
SMALL_BATCH_ROWS = 8


class Overloaded(Exception):
    """The request is refused to protect the others: ``reason`` is ``queue_full``,
    ``deadline`` (at arrival: the queue ahead cannot be scored in time), ``timeout`` (its
    deadline passed in the queue) or ``not_ready``; retry after ``retry_after_s``."""

    def __init__(self, reason: str, retry_after_s: float = 1.0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


class Retired(Exception):
    """The batcher was stopped (its model was swapped out): submit to the new one."""


@dataclass
class Job:
    columns: Mapping[str, Sequence[Any]]
    n_rows: int
    arrived: float  # time.monotonic()
    deadline: float  # time.monotonic()
    future: asyncio.Future[np.ndarray]
    context: Mapping[str, Any] | None = None  # /v1/rank: features shared by every row
    missing: Mapping[str, int] | None = None  # None values per column, counted on arrival
    abandoned: bool = False  # its client was answered 503; its rows left the queue count
    taken: bool = False  # in a batch
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = field(default=None)


class Batcher:
    """Gathers requests for one model and scores them in batches on one compute thread.

    Args:
        model: a loaded artifact (``serving.load``).
        metrics: the app's metrics.
        version: the model version, the label of its metrics.
        max_batch_rows: rows per model call at most (a larger request runs alone).
        max_wait_s: how long the oldest request waits for others.
        max_queue_rows: rows queued at most; beyond, requests are shed.
    """

    def __init__(self, model: Any, metrics: Metrics, version: str, *,
                 max_batch_rows: int = 4096, max_wait_s: float = 0.002,
                 max_queue_rows: int = 16384) -> None:
        self.model = model
        self.metrics = metrics
        self.version = version
        self.max_batch_rows = max_batch_rows
        self.max_wait_s = max_wait_s
        self.max_queue_rows = max_queue_rows
        self.num_sparse = len(model.contract["sparse"])
        # a batch of r rows takes about seconds_per_batch + r * seconds_per_row (measured;
        # 0 until the first batches or the warm-up)
        self.seconds_per_row = 0.0
        self.seconds_per_batch = 0.0
        self.queued_rows = 0
        self._busy_until = 0.0  # when the batch being scored should end (time.monotonic())
        self._last_end = -math.inf  # when the last batch ended (time.monotonic())
        self._jobs: collections.deque[Job] = collections.deque()
        self._arrival = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix=f"ctrctl-score-{version}")
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._in_flight = False  # a batch is on the compute thread
        #: Requests scored on the event loop's thread (idle batcher), for tests and metrics.
        self.inline_requests = 0
        # (position, name, whether a missing value takes id 0 as an unseen one does):
        # the ids of one all-missing row give each vocabulary feature's id of a missing value
        sparse = model.contract["sparse"]
        vocab = [i for i, f in enumerate(sparse)
                 if f["mode"] == "vocab" and not f.get("separator")]
        _, ids, lengths = model_api.encode_columns(model, {}, 1)
        missing_ids = [chunk.tolist() for chunk in torch.split(ids, lengths.tolist())]
        self._vocab_features = [(i, sparse[i]["name"], missing_ids[i] == [0]) for i in vocab]
        # label children looked up once: a lookup per feature and request adds up
        self._oov_counters = [metrics.feature_oov.labels(name) for i, name, _ in
                              self._vocab_features]
        self._zch_counters: dict[str, Any] = {}
        self._queue_wait = metrics.queue_wait.labels(version)
        self._batch_rows = metrics.batch_rows.labels(version)
        self._scores = metrics.score.labels(version)

    def warm(self, columns: Mapping[str, Sequence[Any]], n_rows: int, repeats: int = 3) -> None:
        """Score a batch, and its first row alone, a few times (first calls are slow), and
        measure the fixed cost of a model call and the cost per row."""
        one_row = {name: list(values[:1]) for name, values in columns.items()}
        for _ in range(repeats):
            timed = []
            for part, rows in ((one_row, 1), (columns, n_rows)):
                start = time.perf_counter()
                model_api.score_columns(self.model, part, rows)
                timed.append(time.perf_counter() - start)
        self.seconds_per_batch = timed[0]
        self.seconds_per_row = max(timed[1] - timed[0], 0.0) / max(n_rows - 1, 1)

    def estimate(self, rows: int) -> float:
        """Seconds one batch of ``rows`` rows should take (encoding and scoring)."""
        return self.seconds_per_batch + rows * self.seconds_per_row

    def _measured(self, rows: int, seconds: float) -> None:
        """Learn from a batch: a small one measures the fixed cost, a larger one the cost per
        row beyond it (a run of 1-row requests, nearly all fixed cost, must not make a
        270-row request look like 270 of them to the deadline test)."""
        if rows <= SMALL_BATCH_ROWS:
            self.seconds_per_batch = _average(self.seconds_per_batch, seconds)
            if self.seconds_per_row == 0:  # no larger batch yet: all of it per row
                self.seconds_per_row = seconds / rows
        else:
            per_row = max(seconds - self.seconds_per_batch, 0.0) / rows
            self.seconds_per_row = _average(self.seconds_per_row, per_row)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Refuse new requests, score those queued, stop the thread."""
        if self._closed:
            return
        self._closed = True
        self._arrival.set()
        if self._task is not None:
            await self._task
        self._executor.shutdown(wait=True)

    async def submit(self, columns: Mapping[str, Sequence[Any]], n_rows: int,
                     deadline: float, context: Mapping[str, Any] | None = None,
                     missing: Mapping[str, int] | None = None) -> np.ndarray:
        """Scores (n_rows,) for raw columns (and ``context``: features of every row, encoded
        once), or :class:`Overloaded` / an ``InputError``. ``missing``: the None values per
        column if the caller counted them already (the out-of-vocabulary count reuses
        them)."""
        if self._closed:
            raise Retired()
        now = time.monotonic()
        if self.queued_rows + n_rows > self.max_queue_rows and self.queued_rows > 0:
            raise Overloaded("queue_full", self._retry_after())
        # the batch on the thread now, then every queued row, then this request's
        expected = max(now, self._busy_until) + self.estimate(self.queued_rows + n_rows)
        # a margin for what the estimate misses (the event loop's own work, a busy machine)
        if expected > now + ADMIT_SHARE * (deadline - now):
            raise Overloaded("deadline", self._retry_after())
        job = Job(columns, n_rows, now, deadline, asyncio.get_running_loop().create_future(),
                  context or None, missing)
        if self._idle(now) and n_rows <= self.max_batch_rows:
            return self._score_inline(job)
        self.queued_rows += n_rows
        self._jobs.append(job)
        self._arrival.set()
        try:
            return await asyncio.wait_for(asyncio.shield(job.future),
                                          max(deadline - time.monotonic(), 0.0))
        except TimeoutError:
            if job.taken:  # being scored now: a late answer beats throwing the work away
                return await job.future
            job.abandoned = True
            self.queued_rows -= n_rows
            raise Overloaded("timeout", self._retry_after()) from None

    def _idle(self, now: float) -> bool:
        """Nothing queued, nothing on the compute thread, and no batch ended within the
        batching wait (the rule by which :meth:`_run` waits for company)."""
        return (not self._jobs and not self._in_flight
                and now - self._last_end >= self.max_wait_s)

    def _score_inline(self, job: Job) -> np.ndarray:
        """Score ``job`` now, on the calling (event loop) thread."""
        self.inline_requests += 1
        job.taken = True
        self._busy_until = time.monotonic() + self.estimate(job.n_rows)
        try:
            results, scores = self._score([job])
        finally:
            self._last_end = time.monotonic()
        if scores is not None:
            asyncio.get_running_loop().call_soon(self._observe_scores, scores)
        [result] = results
        if isinstance(result, BaseException):
            raise result
        return result

    def check_admission(self, deadline: float) -> None:
        """Refuse (:class:`Overloaded`) before the body is even read when the queue ahead
        alone cannot be scored by ``deadline``: parsing a request that will be refused
        would take time from the ones being served."""
        now = time.monotonic()
        if max(now, self._busy_until) + self.queued_rows * self.seconds_per_row > deadline:
            raise Overloaded("deadline", self._retry_after())

    def _retry_after(self) -> float:
        return max(1.0, self.queued_rows * self.seconds_per_row)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._jobs:
                if self._closed:
                    return
                self._arrival.clear()
                await self._arrival.wait()
            # Wait for company only under load (a batch ended within the wait): a request
            # reaching an idle server is scored at once, and under load the requests that
            # queue while a batch is scored form the next one anyway.
            busy = time.monotonic() - self._last_end < self.max_wait_s
            flush_at = self._jobs[0].arrived + (self.max_wait_s if busy else 0.0)
            while self.queued_rows < self.max_batch_rows and not self._closed:
                wait = flush_at - time.monotonic()
                if wait <= 0:
                    break
                self._arrival.clear()
                try:
                    await asyncio.wait_for(self._arrival.wait(), wait)
                except TimeoutError:
                    break
            batch: list[Job] = []
            rows = 0
            while self._jobs and (not batch or
                                  rows + self._jobs[0].n_rows <= self.max_batch_rows):
                job = self._jobs.popleft()
                if job.abandoned:  # answered already, not counted in queued_rows
                    continue
                job.taken = True
                batch.append(job)
                rows += job.n_rows
            self.queued_rows -= rows
            if not batch:
                continue
            self._busy_until = time.monotonic() + self.estimate(rows)
            self._in_flight = True
            try:
                results, scores = await loop.run_in_executor(self._executor, self._score,
                                                             batch)
            finally:
                self._in_flight = False
                self._last_end = time.monotonic()
            for job, result in zip(batch, results, strict=True):
                if job.future.done():
                    continue
                if isinstance(result, BaseException):
                    job.future.set_exception(result)
                else:
                    job.future.set_result(result)
            if scores is not None:  # after the answers: the handlers resumed first run first
                loop.call_soon(self._observe_scores, scores)

    def _observe_scores(self, scores: np.ndarray) -> None:
        self._scores.observe_many(scores)

    def _score(self, batch: list[Job]
               ) -> tuple[list[np.ndarray | BaseException], np.ndarray | None]:
        """On the compute thread: encode each job, score the good ones in one call.

        Returns:
            Per job its scores or its error, and every score of the batch (None if none)."""
        start = time.monotonic()
        results: list[np.ndarray | BaseException | None] = [None] * len(batch)
        parts: list[tuple[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = []
        pooled_parts: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (job, dense, pooled)
        for i, job in enumerate(batch):
            if job.abandoned or start > job.deadline:
                results[i] = Overloaded("timeout")
                continue
            self._queue_wait.observe(start - job.arrived)
            try:
                pooled = (pool_with_context(self.model, job.columns, job.n_rows, job.context)
                          if job.context else None)
                if pooled is not None:
                    dense, embedded, inputs = pooled
                    pooled_parts.append((i, dense, embedded))
                else:
                    inputs = (encode_with_context(self.model, job.columns, job.n_rows,
                                                  job.context) if job.context else
                              model_api.encode_columns(self.model, job.columns, job.n_rows))
                    parts.append((i, inputs))
            except model_api.InputError as exc:
                results[i] = exc
                continue
            except model_api.ArtifactError as exc:
                results[i] = model_api.input_error(str(exc))
                continue
            self._count_oov(job, inputs)
        if parts or pooled_parts:
            merged = merge_inputs([p for _, p in parts], self.num_sparse) if parts else None
            if pooled_parts:  # through the two stages: the other jobs' lookups as one call
                dense_parts = [d for _, d, _ in pooled_parts]
                embedded_parts = [e for _, _, e in pooled_parts]
                if merged is not None:
                    dense_parts.insert(0, merged[0])
                    embedded_parts.insert(0, self.model.pool(merged[1], merged[2]))
                scores = self.model.score_pooled(torch.cat(dense_parts),
                                                 torch.cat(embedded_parts)).numpy()
            else:
                assert merged is not None
                scores = self.model.score(*merged).numpy()
            rows = len(scores)
            self._batch_rows.observe(rows)
            # encoding and scoring: what a batch will cost (the deadline test's estimate)
            self._measured(rows, time.monotonic() - start)
            offset = 0
            for i, n in ([(i, p[0].size(0)) for i, p in parts]
                         + [(i, d.size(0)) for i, d, _ in pooled_parts]):
                results[i] = scores[offset:offset + n]
                offset += n
        return ([r if r is not None else RuntimeError("not scored") for r in results],
                scores if parts or pooled_parts else None)

    def _count_oov(self, job: Job, inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
                   ) -> None:
        """Rows of a vocabulary feature whose present value mapped to row 0 (unknown), and
        keys of a managed-collision feature that own no row."""
        zch = getattr(self.model, "zch_keys", None)
        if zch:
            for name, n in self.model.default_row_lookups(inputs[1], inputs[2]).items():
                if n:
                    counter = self._zch_counters.get(name)
                    if counter is None:
                        counter = self._zch_counters[name] = \
                            self.metrics.zch_default.labels(name)
                    counter.inc(n)
        if not self._vocab_features:
            return
        # Ids 0 per feature in one pass over all ids; a vocabulary maps an unseen value to 0,
        # and a missing one to its null id (0 too when no null was seen in training).
        # (numpy views of the tensors: a few small ops, each cheaper than torch's dispatch)
        ids, lengths = inputs[1].numpy(), inputs[2].numpy()
        per_feature = lengths.reshape(self.num_sparse, -1).sum(1)  # (F,)
        ends = np.cumsum(per_feature)  # (F,) where each feature's run of ids ends
        zeros_before = np.zeros(len(ids) + 1, dtype=np.int64)  # ids 0 before each position
        np.cumsum(ids == 0, out=zeros_before[1:])
        zeros = zeros_before[ends] - zeros_before[ends - per_feature]  # (F,) ids 0 per feature
        counts, per_row = zeros.tolist(), per_feature.tolist()
        for (f, name, missing_is_zero), counter in zip(self._vocab_features,
                                                       self._oov_counters, strict=True):
            oov = counts[f]
            if not oov or per_row[f] != job.n_rows:
                continue  # no id 0 (so no unseen value), or not one id per row
            values = job.columns.get(name)
            if values is None:
                continue  # absent (every row missing), or a /v1/rank context feature
            if missing_is_zero:
                oov -= _missing(values, job.missing.get(name) if job.missing else None)
            if oov:
                counter.inc(oov)


def _average(old: float, new: float) -> float:
    """An exponentially weighted average of measured times (the first one as it is)."""
    return new if old == 0 else 0.8 * old + 0.2 * new


def _missing(values: Sequence[Any], nones: int | None = None) -> int:
    """Values the encoder takes as missing: None and "" (as the preprocess step);
    ``nones``: the None values if counted already."""
    return (values.count(None) if nones is None else nones) + values.count("")


def merge_inputs(parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                 num_sparse: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Several requests' (dense, ids, lengths) as one batch, key-major as the program reads.

    Lengths (F, B_r) per request are joined along the batch: (F, B_1 + B_2 + ...); ids,
    feature after feature, take each request's run of that feature in turn.
    """
    if len(parts) == 1:
        return parts[0]
    dense = torch.cat([p[0] for p in parts])  # (B, F_dense)
    lengths = [p[2].view(num_sparse, -1) for p in parts]  # (F, B_r) each
    chunks = [torch.split(p[1], length.sum(1).tolist()) for p, length in zip(parts, lengths,
                                                                              strict=True)]
    ids = torch.cat([c[f] for f in range(num_sparse) for c in chunks])
    return dense, ids, torch.cat(lengths, dim=1).reshape(-1)


def encode_with_context(model: Any, columns: Mapping[str, Sequence[Any]], n_rows: int,
                        context: Mapping[str, Any]
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Model inputs of ``n_rows`` candidates that share the ``context`` features.

    The context is encoded once (one row) and its ids and dense values broadcast to every
    candidate: the same inputs, bitwise, as encoding the merged rows, for the encoding cost
    of the candidates' own features plus one row. (The lookups of the context's ids still
    run once per candidate: the artifact's program takes the ids, not pooled vectors.)::

        lengths (F, B):  candidate features as encoded | context features: (F_ctx, 1) -> (F_ctx, B)
        ids:             feature after feature; a context feature's run is its row's ids x B

    Raises:
        InputError: a bad context value (``feature`` prefixed ``context.``) or candidate value.
    """
    contract = model.contract
    features = {f["name"] for part in ("dense", "sparse") for f in contract[part]}
    if not set(context) <= features:
        # a raw column that features are derived from (Avazu's ``hour``): which features
        # come from it is the encoder's business, so the merged rows are encoded instead
        every_row = {**columns, **{name: [value] * n_rows for name, value in context.items()}}
        return model_api.encode_columns(model, every_row, n_rows)
    dense, ids, lengths = model_api.encode_columns(model, columns, n_rows)
    c_dense, c_ids, c_lengths = _encode_context(model, context)
    dense = _broadcast_dense(model, dense, c_dense, context)
    num_sparse = len(contract["sparse"])
    per_row = lengths.view(num_sparse, n_rows)  # (F, B)
    c_per_row = c_lengths.view(num_sparse, 1)  # (F, 1)
    chunks = torch.split(ids, per_row.sum(1).tolist())
    c_chunks = torch.split(c_ids, c_per_row.sum(1).tolist())
    out_ids, out_lengths = [], []
    for f, feature in enumerate(contract["sparse"]):
        if feature["name"] in context:
            out_ids.append(c_chunks[f].repeat(n_rows))
            out_lengths.append(c_per_row[f].expand(n_rows))
        else:
            out_ids.append(chunks[f])
            out_lengths.append(per_row[f])
    return dense, torch.cat(out_ids), torch.cat(out_lengths)


def pool_with_context(model: Any, columns: Mapping[str, Sequence[Any]], n_rows: int,
                      context: Mapping[str, Any]
                      ) -> tuple[torch.Tensor, torch.Tensor,
                                 tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None:
    """The dense stage's inputs of ``n_rows`` candidates sharing ``context``, each context
    feature looked up once: (dense (B, F_dense), pooled (B, F, D), the candidates' own
    model inputs); None where the artifact has no stages (format 1), runs compiled, or the
    context holds a raw column that features are derived from (then
    :func:`encode_with_context`).

    The candidates' bags of a context feature are left empty (length 0: no lookup), the
    context's row (its features only) is pooled in the same call, after the candidates',
    and its (1, F_ctx, D) vectors are broadcast into those places: the scores are bitwise
    those of the merged rows (every bag pools on its own)::

        lengths (F, B + 1):  candidate features as encoded, context features 0 | context row
        pooled (B + 1, F, D) -> pooled[:B] with [:B, ctx] <- pooled[B, ctx]

    Raises:
        InputError: a bad context value (``feature`` prefixed ``context.``) or candidate value.
    """
    contract = model.contract
    features = {f["name"] for part in ("dense", "sparse") for f in contract[part]}
    if (not getattr(model, "stages", None) or getattr(model, "compiled", False)
            or not set(context) <= features):
        return None
    dense, ids, lengths = model_api.encode_columns(model, columns, n_rows)
    c_dense, c_ids, c_lengths = _encode_context(model, context)
    dense = _broadcast_dense(model, dense, c_dense, context)
    shared = [f["name"] in context for f in contract["sparse"]]
    in_context = torch.tensor(shared, dtype=torch.bool)  # (F,)
    own_ids, own_lengths = _keep_features(ids, lengths, shared, keep=False)  # (F * B,)
    ctx_ids, ctx_lengths = _keep_features(c_ids, c_lengths, shared, keep=True)  # (F,)
    # one lookup call: the context's row after the candidates' (B + 1 rows, key-major)
    _, both_ids, both_lengths = merge_inputs(
        [(dense, own_ids, own_lengths), (c_dense, ctx_ids, ctx_lengths)], len(shared))
    pooled = model.pool(both_ids, both_lengths)  # (B + 1, F, D)
    if any(shared):
        pooled[:n_rows, in_context] = pooled[n_rows:, in_context]  # <- (1, F_ctx, D)
    return dense, pooled[:n_rows], (dense, own_ids, own_lengths)


def _keep_features(ids: torch.Tensor, lengths: torch.Tensor, shared: list[bool], keep: bool
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs with only the features whose ``shared`` flag is ``keep``; the others' bags
    empty (length 0)."""
    per_row = lengths.view(len(shared), -1)  # (F, B)
    chunks = torch.split(ids, per_row.sum(1).tolist())
    kept = torch.cat([ids[:0], *(c for c, s in zip(chunks, shared, strict=True) if s == keep)])
    drop = torch.tensor([s != keep for s in shared], dtype=torch.bool)
    return kept, per_row.masked_fill(drop[:, None], 0).reshape(-1)


def _encode_context(model: Any, context: Mapping[str, Any]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The context as one row of model inputs; its errors name ``context.FEATURE``."""
    try:
        return model_api.encode_columns(model, {k: [v] for k, v in context.items()}, 1)
    except model_api.InputError as exc:
        feature = getattr(exc, "feature", None)
        raise model_api.input_error(f"context: {exc}", feature=f"context.{feature}",
                                    expected=getattr(exc, "expected", None)) from None


def _broadcast_dense(model: Any, dense: torch.Tensor, c_dense: torch.Tensor,
                     context: Mapping[str, Any]) -> torch.Tensor:
    """``dense`` (B, F_dense) with the context's dense features (1, F_dense) in every row."""
    names = [f["name"] for f in model.contract["dense"]]
    shared = [j for j, name in enumerate(names) if name in context]
    if shared:
        dense = dense.clone()
        dense[:, shared] = c_dense[:, shared]  # (B, len(shared)) <- (1, len(shared))
    return dense
