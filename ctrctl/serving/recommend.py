"""``POST /v1/recommend``: retrieve then rank, when ``ctrctl serve`` is given a bundle.

::

    POST /v1/recommend  {"query": {"user": "196"}, "k": 10, "candidates": 200}
      -> {"items": [...], "scores": [...], "retrieval_scores": [...], "candidates": 200,
          "model": {"name", "version", "uri"}, "request_id": ...}

A bundle (``ctrctl quantize --index INDEX --ranker RANKER --out BUNDLE``,
:mod:`ctrctl.inference.bundle`) holds a retrieval export and a ranker export. The server
serves the ranker as any export (``/v1/score`` and ``/v1/rank`` stay), and this endpoint:
the query tower embeds the query, the index returns the top ``candidates`` items, the ranker
scores them through the same batcher as ``/v1/rank`` (the query as context, encoded once;
the item id as the ranker's item column), and the best ``k`` come back, best first, with
the ranker's click probabilities (``scores``) and the index's cosines.

A body that is not JSON is a 400; a missing or unknown field, a value of the wrong type,
``k`` above ``candidates``, an unknown query feature or a query without any of the query
tower's features is a 422 naming the field; ``candidates`` above
``--max-rows-per-request`` a 413.

MODEL may be a bundle folder or a registered bundle (``models:/NAME/VERSION`` or
``@ALIAS``, tagged ``ctrctl.kind: recommend_bundle``): a registered one is downloaded once
into the cache. The serving slot holds both stages (:mod:`ctrctl.serving.models`), so an
alias that moves to another bundle version is hot-reloaded as a ranker is: both stages
loaded and checked beside the serving ones, then swapped in together; a request runs the
retrieval and the ranker of one version, the one its answer names.

Example:
    >>> model, bundle = resolve_bundle("bundle")          # ("bundle/ranker", "bundle")
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ctrctl.errors import ConfigError, CtrctlError
from ctrctl.inference.bundle import BUNDLE_KIND, Bundle, is_bundle, top_k
from ctrctl.serving import model_api
from ctrctl.serving.batcher import Overloaded
from ctrctl.serving.requests import EXPECTED_VALUE, ClientError, Value
from ctrctl.serving.source import REGISTRY_URI, ModelSource

if TYPE_CHECKING:
    from ctrctl.serving.app import ServerState
    from ctrctl.serving.models import Slot

__all__ = ["RecommendRequest", "install", "resolve_bundle"]

logger = logging.getLogger(__name__)

class RecommendRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: dict[str, Value] = Field(min_length=1)
    k: int = Field(default=10, ge=1)
    candidates: int = Field(default=200, ge=1)


def resolve_bundle(model: str, tracking_uri: str | None = None,
                   cache_dir: str | None = None) -> tuple[str, str | None]:
    """(the ranker to serve, the bundle folder) for MODEL; (MODEL, None) when it is not a
    bundle. A registered bundle is downloaded into ``cache_dir`` first."""
    if not is_registered_bundle(model, tracking_uri):
        return (str(Path(model) / "ranker"), model) if is_bundle(model) else (model, None)
    cache = Path(cache_dir) if cache_dir else None
    resolved = ModelSource.parse(model, tracking_uri, cache, bundle=True).resolve()
    return str(resolved.folder), str(resolved.bundle)


def is_registered_bundle(model: str, tracking_uri: str | None) -> bool:
    """Whether MODEL is a ``models:/`` URI whose version (now) is tagged as a bundle."""
    if not REGISTRY_URI.match(model):
        return False
    try:
        return ModelSource(model, tracking_uri).registered_kind() == BUNDLE_KIND
    except CtrctlError:  # the ranker's own loader names what is wrong with the URI
        return False


def install(app: FastAPI, state: ServerState) -> None:
    """Add ``POST /v1/recommend`` to ``app`` when the server's config names a bundle."""
    if not getattr(state.config, "bundle", None):
        return

    def stages(slot: Slot) -> Bundle:
        """The slot's retrieval stage (a canary of a plain ranker: the primary's)."""
        assert state.router is not None
        bundle = slot.bundle or state.router.slots["primary"].bundle
        assert bundle is not None, "a bundle server's primary slot holds a bundle"
        return bundle

    @app.post("/v1/recommend")
    async def recommend(request: Request) -> Response:
        started = time.perf_counter()
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        version = "none"
        try:
            if state.router is None:
                raise Overloaded("not_ready", 1.0)
            body = _parse(await request.body(), state.config.max_rows_per_request)
            deadline = time.monotonic() + state.config.timeout_ms / 1000.0

            async def answer(slot: Slot) -> dict[str, Any]:
                # one version's retrieval and ranker: a slot swapped out before its batcher
                # took the request is left for the new one, from the retrieval on
                bundle = stages(slot)
                _check_query(body, bundle)
                try:
                    items, cosines = bundle.retrieve(body.query, body.candidates)
                except model_api.InputError as exc:
                    raise _value_error(exc) from None
                except ValueError as exc:  # the query tower's encoder (EncodeError)
                    raise _value_error(exc) from None
                columns, context = bundle.ranker_columns(body.query, items)
                try:
                    scores = await slot.batcher.submit(columns, len(items), deadline, context)
                except model_api.InputError as exc:
                    raise _value_error(exc) from None
                return top_k(items, scores, cosines, body.k).to_dict()

            ranked, slot = await state.on_slot(request_id, answer)
            version = slot.version
            payload = {**ranked, "model": slot.resolved.info(), "request_id": request_id}
            response: Response = Response(json.dumps(payload).encode(),
                                          media_type="application/json",
                                          headers={"X-Request-Id": request_id,
                                                   "X-Model-Version": version})
        except ClientError as exc:
            response = JSONResponse(exc.body, status_code=exc.status,
                                    headers={**exc.headers, "X-Request-Id": request_id})
        except Overloaded as exc:
            state.metrics.shed.labels(exc.reason).inc()
            response = JSONResponse(
                {"error": "overloaded" if exc.reason != "not_ready" else "not_ready",
                 "message": f"request refused ({exc.reason.replace('_', ' ')}): retry later"},
                status_code=503, headers={"Retry-After": str(max(1, round(exc.retry_after_s))),
                                          "X-Request-Id": request_id})
        state.observe_request("recommend", str(response.status_code), version,
                              time.perf_counter() - started)
        return response


def _parse(body: bytes, max_candidates: int) -> RecommendRequest:
    try:
        request = RecommendRequest.model_validate_json(body)
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        # (query, feature, the union member that failed): the field is query.feature
        loc = ".".join(str(p) for p in error["loc"][:2])
        if error["type"] in ("json_invalid", "json_type"):
            raise ClientError(400, "invalid_json", f"the body is not valid JSON: "
                              f"{error['msg']}", expected="a JSON object") from None
        if error["type"] == "missing":
            raise ClientError(422, "missing_field", f"the body has no {loc!r}", field=loc,
                              expected="an object of query feature -> value") from None
        if error["type"] == "extra_forbidden":
            raise ClientError(422, "unknown_field", f"the body has an unknown field {loc!r}",
                              field=loc, expected="only 'query', 'k' and 'candidates'") from None
        expected = EXPECTED_VALUE if loc.startswith("query.") else None
        raise ClientError(422, "wrong_type", f"{loc or 'the body'}: {error['msg']}",
                          field=loc or None, expected=expected) from None
    if request.candidates > max_candidates:
        raise ClientError(413, "too_many_rows", f"{request.candidates} candidates in one "
                          f"request, at most {max_candidates} are accepted",
                          field="candidates", expected=f"at most {max_candidates}")
    if request.k > request.candidates:
        raise ClientError(422, "k_above_candidates", f"k {request.k} is more than the "
                          f"{request.candidates} candidates ranked", field="k",
                          expected=f"k <= candidates ({request.candidates})")
    return request


def _check_query(request: RecommendRequest, bundle: Bundle) -> None:
    """Refuse a query feature neither stage of ``bundle`` reads, or a query without any of
    the query tower's."""
    known = set(bundle.query_columns) | set(bundle.context_columns)
    unknown = sorted(set(request.query) - known)
    if unknown:
        raise ClientError(422, "unknown_feature", f"query feature {unknown[0]!r} is not an "
                          "input of the query tower or the ranker's context",
                          field=f"query.{unknown[0]}", expected=f"one of {sorted(known)}")
    if not set(request.query) & set(bundle.query_columns):
        raise ClientError(422, "no_query_feature", "the query has none of the query tower's "
                          "features", field="query",
                          expected=f"one of {bundle.query_columns}")


def _value_error(exc: Exception) -> ClientError:
    feature = getattr(exc, "feature", None)
    return ClientError(422, "invalid_value", str(exc),
                       field=f"query.{feature}" if feature else "query",
                       expected=getattr(exc, "expected", None) or None)


def check_bundle(model: str) -> None:
    """Refuse a bundle folder without its ranker before the server starts."""
    if is_bundle(model) and not (Path(model) / "ranker").is_dir():
        raise ConfigError("the bundle has no ranker folder", where=model,
                          hint="make it again with ctrctl quantize --index --ranker")


def recommend_config(model: str, tracking_uri: str | None) -> dict[str, Any]:
    """The ``ServeConfig`` fields of MODEL: ``model`` and ``bundle`` (MODEL again when it
    names a bundle folder or a registered bundle, else None). The server downloads a
    registered bundle when it resolves it."""
    check_bundle(model)
    bundled = is_bundle(model) or is_registered_bundle(model, tracking_uri)
    return {"model": model, "bundle": model if bundled else None}
