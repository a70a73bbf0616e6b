"""The HTTP app of ``ctrctl serve`` (FastAPI): endpoints, error bodies, start and stop.

Endpoints::

    POST /v1/score   {"rows": [{feature: raw value}, ...]}
                     -> {"scores": [...], "model": {"name", "version", "uri"}, "request_id"}
    POST /v1/rank    {"context": {...}, "candidates": [{...}, ...]} -> scores in candidate order
    GET  /healthz    alive          GET /readyz   model loaded and warmed (503 before)
    GET  /metrics    Prometheus     GET /v1/model name, version, lineage tags, input contract

A client mistake is a 4xx whose JSON body names the field, the row (or candidate) and
what was expected (:mod:`ctrctl.serving.requests`); load that cannot be served in time is a
503 with ``Retry-After``. Every answer carries ``X-Request-Id`` (the client's, or a new one:
it also picks the canary side) and ``X-Model-Version``. A client may shorten its deadline
with ``X-Timeout-Ms`` (never beyond ``--timeout-ms``).

Example:
    >>> app = create_app(ServeConfig(model="export"))
    >>> uvicorn.run(app, host="127.0.0.1", port=8080)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ctrctl.serving import model_api
from ctrctl.serving.batcher import Overloaded, Retired
from ctrctl.serving.config import ENV, ServeConfig
from ctrctl.serving.metrics import Metrics
from ctrctl.serving.models import Reloader, Router, Slot, load_slot
from ctrctl.serving.request_log import RequestLog
from ctrctl.serving.requests import ClientError, Parser, count_missing, encode_response
from ctrctl.serving.source import ModelSource

logger = logging.getLogger(__name__)

T = TypeVar("T")


class ServerState:
    """What the endpoints share: the router (None until loaded), parser, metrics, log."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        cache = Path(config.cache_dir) if config.cache_dir else None
        self.sources = {"primary": ModelSource.parse(config.model, config.tracking_uri, cache,
                                                     bundle=config.bundle is not None)}
        if config.canary:
            self.sources["canary"] = ModelSource.parse(config.canary, config.tracking_uri,
                                                       cache)
        self.router: Router | None = None
        self.reloader: Reloader | None = None
        self.parser: Parser | None = None
        self.log: RequestLog | None = None
        self.load_error: str | None = None
        self.tasks: list[asyncio.Task[Any]] = []
        self._feature_counters: dict[str, tuple[Any, Any]] = {}
        self._request_metrics: dict[tuple[str, str, str], tuple[Any, Any]] = {}

    async def start(self) -> None:
        """Load and warm the models, then serve (``/readyz`` turns 200)."""
        try:
            primary = await load_slot(self.sources["primary"], None, self.config,
                                      self.metrics, "primary")
            canary = None
            if "canary" in self.sources:
                canary = await load_slot(self.sources["canary"], None, self.config,
                                         self.metrics, "canary")
        except Exception as exc:
            self.load_error = str(exc)
            logger.error("the model could not be loaded: %s", exc)
            raise
        columns = model_api.input_columns(primary.model)
        self.parser = Parser(columns, self.config.max_rows_per_request)
        if self.config.log_dir:
            self.log = RequestLog(self.config.log_dir, columns, self.metrics)
        self.router = Router(primary, canary, self.config.canary_percent)
        self.reloader = Reloader(self.router, self.sources, self.config, self.metrics)
        self.tasks.append(asyncio.get_running_loop().create_task(self.reloader.run()))

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.router is not None:
            await self.router.stop()  # scores what is queued
        if self.log is not None:
            await asyncio.to_thread(self.log.close)

    async def score(self, request_id: str, columns: Mapping[str, Sequence[Any]], n_rows: int,
                    deadline: float, context: Mapping[str, Any] | None = None,
                    missing: Mapping[str, int] | None = None) -> tuple[np.ndarray, Slot]:
        """Scores from the slot the request id picks (the new one if it was just swapped);
        ``missing``: :meth:`count_features`' counts, reused by the batcher."""

        async def submit(slot: Slot) -> np.ndarray:
            return await slot.batcher.submit(columns, n_rows, deadline, context, missing)

        return await self.on_slot(request_id, submit)

    async def on_slot(self, request_id: str, work: Callable[[Slot], Awaitable[T]]
                      ) -> tuple[T, Slot]:
        """``work`` on the slot the request id picks; on the new slot, from the start,
        when that one was swapped out before its batcher took the request."""
        if self.router is None:
            raise Overloaded("not_ready", 1.0)
        for _ in range(3):
            slot = self.router.pick(request_id)
            try:
                return await work(slot), slot
            except Retired:
                continue
        raise Overloaded("deadline", 1.0)

    def observe_request(self, endpoint: str, status: str, version: str, seconds: float
                        ) -> None:
        """An answered request in the duration histogram and the request counter; their
        label children are looked up once per (endpoint, status, version)."""
        key = (endpoint, status, version)
        children = self._request_metrics.get(key)
        if children is None:
            children = self._request_metrics[key] = (self.metrics.duration.labels(*key),
                                                     self.metrics.requests.labels(*key))
        children[0].observe(seconds)
        children[1].inc()

    def count_features(self, columns: Mapping[str, Sequence[Any]], n_rows: int
                       ) -> dict[str, int]:
        """Count the rows and missing (None) values per input column; returns the None
        values per column (absent columns: every row)."""
        assert self.parser is not None
        if not self._feature_counters:  # a label lookup per feature and request adds up
            self._feature_counters = {
                name: (self.metrics.feature_values.labels(name),
                       self.metrics.feature_missing.labels(name))
                for name in self.parser.columns}
        counters = self._feature_counters
        counted = count_missing(columns, self.parser.columns, n_rows)
        for name, missing in counted.items():
            values, missed = counters[name]
            values.inc(n_rows)
            if missing:
                missed.inc(missing)
        return counted


def _error_response(exc: ClientError, request_id: str) -> JSONResponse:
    return JSONResponse(exc.body, status_code=exc.status,
                        headers={**exc.headers, "X-Request-Id": request_id})


def _input_error(exc: Exception, index_name: str) -> ClientError:
    feature = getattr(exc, "feature", None)
    row = getattr(exc, "row", None)
    return ClientError(422, "invalid_value", str(exc), field=feature, row=row,
                       expected=getattr(exc, "expected", None), index_name=index_name)


def _timeout_ms(request: Request, config: ServeConfig) -> float:
    """The request's deadline: ``X-Timeout-Ms`` when the client sends a shorter one."""
    asked = request.headers.get("x-timeout-ms")
    if asked is None:
        return config.timeout_ms
    try:
        value = float(asked)
    except ValueError:
        raise ClientError(400, "invalid_header", f"X-Timeout-Ms {asked!r} is not a number",
                          field="X-Timeout-Ms", expected="milliseconds") from None
    if not value > 0:
        raise ClientError(400, "invalid_header", "X-Timeout-Ms must be positive",
                          field="X-Timeout-Ms", expected="milliseconds > 0")
    return min(value, config.timeout_ms)


def create_app(config: ServeConfig) -> FastAPI:
    """The app serving ``config.model`` (loaded in the background once the app starts)."""
    state = ServerState(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        import torch

        torch.set_num_threads(config.torch_threads())
        loading = asyncio.get_running_loop().create_task(state.start())
        try:
            yield
        finally:
            loading.cancel()
            with contextlib.suppress(BaseException):
                await loading
            await state.stop()

    app = FastAPI(title="ctrctl serve", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.serving = state

    async def handle(request: Request, endpoint: str) -> Response:
        started = time.perf_counter()
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        version = "none"
        index_name = "candidate" if endpoint == "rank" else "row"
        try:
            if state.parser is None or state.router is None:
                raise Overloaded("not_ready", 1.0)
            deadline = time.monotonic() + _timeout_ms(request, config) / 1000.0
            state.router.pick(request_id).batcher.check_admission(deadline)
            body = await request.body()
            context: dict[str, Any] = {}
            if endpoint == "rank":
                columns, n_rows, context = state.parser.rank(body)
                every_row = {**columns, **{k: [v] * n_rows for k, v in context.items()}}
            else:
                columns, n_rows = state.parser.score(body)
                every_row = columns
            missing = state.count_features(every_row, n_rows)
            try:
                scores, slot = await state.score(request_id, columns, n_rows, deadline,
                                                 context, missing)
            except model_api.InputError as exc:
                raise _input_error(exc, index_name) from None
            version = slot.version
            if state.log is not None:
                state.log.append(request_id, version, every_row, scores.tolist())
            response: Response = Response(encode_response(scores, slot.resolved.info(),
                                                          request_id),
                                          media_type="application/json",
                                          headers={"X-Request-Id": request_id,
                                                   "X-Model-Version": version})
        except ClientError as exc:
            response = _error_response(exc, request_id)
        except Overloaded as exc:
            state.metrics.shed.labels(exc.reason).inc()
            retry = str(max(1, round(exc.retry_after_s)))
            response = _error_response(ClientError(
                503, "overloaded" if exc.reason != "not_ready" else "not_ready",
                f"request refused ({exc.reason.replace('_', ' ')}): retry later",
                headers={"Retry-After": retry}), request_id)
        state.observe_request(endpoint, str(response.status_code), version,
                              time.perf_counter() - started)
        return response

    @app.post("/v1/score")
    async def score(request: Request) -> Response:
        return await handle(request, "score")

    @app.post("/v1/rank")
    async def rank(request: Request) -> Response:
        return await handle(request, "rank")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        if state.router is None:
            body = {"status": "loading" if state.load_error is None else "failed"}
            if state.load_error:
                body["error"] = state.load_error
            return JSONResponse(body, status_code=503)
        return JSONResponse({"status": "ready", "versions": {
            role: slot.version for role, slot in state.router.slots.items()}})

    @app.get("/metrics")
    async def metrics() -> Response:
        text, content_type = state.metrics.render()
        return Response(text, media_type=content_type)

    @app.get("/v1/model")
    async def model() -> JSONResponse:
        if state.router is None:
            return JSONResponse({"error": "not_ready", "message": "the model is loading"},
                                status_code=503)
        out: dict[str, Any] = {}
        for role, slot in state.router.slots.items():
            manifest = slot.model.manifest
            out[role] = {**slot.resolved.info(), "tags": slot.resolved.tags,
                         "lineage": {"training_run_id": manifest.get("training_run_id"),
                                     "created": manifest.get("created"),
                                     "hashes": manifest.get("hashes"),
                                     "quantization": manifest.get("quantization")},
                         "input": {"columns": model_api.input_columns(slot.model),
                                   "contract": slot.model.contract}}
            if slot.bundle is not None:
                out[role]["bundle"] = slot.bundle.info
        out["canary_percent"] = state.router.canary_percent
        return JSONResponse(out)

    from ctrctl.serving.recommend import install

    install(app, state)  # POST /v1/recommend when MODEL is a bundle
    return app


def app_from_env() -> FastAPI:
    """The app of a worker process (``uvicorn --factory``): its config from the environment."""
    return create_app(ServeConfig.from_json(os.environ[ENV]))
