"""Request bodies: parsed into columns, and every client mistake as a :class:`ClientError`
naming the field, the row or candidate, and what was expected.

A body is parsed by orjson and turned into columns with C-level passes (rows whose keys
come in one order are transposed by ``zip``; every column's value types are checked as a
set), about a tenth of validating each row with pydantic. A body this fast path does not
accept, for any reason, is parsed again by the pydantic envelope (``ScoreRequest``,
``RankRequest``), which either accepts it the same way or names the mistake: the errors
come from one place, and the fast path can only be faster, never more lenient.

::

    POST /v1/score  {"rows": [{"I1": "3", "C1": "68fd1e64"}, ...]}
    POST /v1/rank   {"context": {"C1": "68fd1e64"}, "candidates": [{"C2": "80e26c9b"}, ...]}

A value is a JSON string, number or null; an absent feature is a missing value; an
unknown feature is an error (never silently dropped).
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

Value = str | int | float | None
#: The Python types of the values the fast path takes as they are (what pydantic's
#: ``Value`` keeps unchanged); any other (a bool, a list) goes through pydantic.
VALUE_TYPES = frozenset({str, int, float, type(None)})
EXPECTED_VALUE = "a string, a number or null"


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rows: list[dict[str, Value]] = Field(min_length=1)


class RankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    context: dict[str, Value] = Field(default_factory=dict)
    candidates: list[dict[str, Value]] = Field(min_length=1)


class ClientError(Exception):
    """A request the server refuses: HTTP status and a JSON body."""

    def __init__(self, status: int, error: str, message: str, *, field: str | None = None,
                 row: int | None = None, expected: str | None = None,
                 headers: Mapping[str, str] | None = None, index_name: str = "row") -> None:
        super().__init__(message)
        self.status = status
        self.headers = dict(headers or {})
        self.body: dict[str, Any] = {"error": error, "message": message}
        if field is not None:
            self.body["field"] = field
        if row is not None:
            self.body[index_name] = row
        if expected is not None:
            self.body["expected"] = expected


class Parser:
    """Validates request bodies for one set of input columns.

    Args:
        columns: the model's raw input columns.
        max_rows: rows (or candidates) per request at most; more is a 413.
    """

    def __init__(self, columns: Sequence[str], max_rows: int) -> None:
        self.columns = list(columns)
        self.known = frozenset(columns)
        self.max_rows = max_rows
        self._score = TypeAdapter(ScoreRequest)
        self._rank = TypeAdapter(RankRequest)

    def score(self, body: bytes) -> tuple[dict[str, list[Any]], int]:
        """``/v1/score`` body -> (columns, rows)."""
        fast = self._fast(body, "rows", frozenset({"rows"}))
        if fast is not None:
            columns, n_rows, _ = fast
            self._check_size(n_rows, "rows")
            return columns, n_rows
        request = self._parse(self._score, body, "rows", "row")
        rows = request.rows
        self._check_size(len(rows), "rows")
        return self._columns(rows, "row"), len(rows)

    def rank(self, body: bytes) -> tuple[dict[str, list[Any]], int, dict[str, Value]]:
        """``/v1/rank`` body -> (candidate columns, candidates, context)."""
        fast = self._fast(body, "candidates", frozenset({"candidates", "context"}))
        if fast is not None:
            columns, n_rows, context = fast
            self._check_size(n_rows, "candidates")
            return columns, n_rows, context
        request = self._parse(self._rank, body, "candidates", "candidate")
        candidates = request.candidates
        self._check_size(len(candidates), "candidates")
        context = request.context
        unknown = sorted(set(context) - self.known)
        if unknown:
            raise ClientError(422, "unknown_feature", f"context feature {unknown[0]!r} is not "
                              "an input of the model", field=f"context.{unknown[0]}",
                              expected=f"one of {self.columns}")
        columns = self._columns(candidates, "candidate")
        both = sorted(set(context) & set(columns))
        if both:
            index = next(i for i, c in enumerate(candidates) if both[0] in c)
            raise ClientError(422, "feature_in_context_and_candidate",
                              f"feature {both[0]!r} is in the context and in candidate "
                              f"{index}: give it in one place", field=both[0], row=index,
                              index_name="candidate",
                              expected="each feature in the context or in the candidates")
        return columns, len(candidates), context

    def _fast(self, body: bytes, list_field: str, fields: frozenset[str]
              ) -> tuple[dict[str, list[Any]], int, dict[str, Value]] | None:
        """(columns, rows, context) of a well-formed body whose features are all known;
        None for anything else (pydantic then names the mistake)."""
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return None
        if type(data) is not dict or not data.keys() <= fields:
            return None
        rows, context = data.get(list_field), data.get("context", {})
        if type(rows) is not list or not rows or type(context) is not dict:
            return None
        if not set(map(type, context.values())) <= VALUE_TYPES:
            return None
        if not set(map(type, rows)) == {dict}:
            return None
        keys = tuple(rows[0])
        if all(tuple(row) == keys for row in rows):  # one key order: transpose in C
            values = zip(*(row.values() for row in rows), strict=True)
            by_name = dict(zip(keys, map(list, values), strict=True)) if keys else {}
        else:
            present, n = set().union(*rows), len(rows)
            by_name = {name: list(map(dict.get, rows, itertools.repeat(name, n)))
                       for name in present}
        if (not by_name.keys() <= self.known or not context.keys() <= self.known
                or not context.keys().isdisjoint(by_name)):
            return None  # pydantic's path names the feature and the row
        for values in by_name.values():
            if not set(map(type, values)) <= VALUE_TYPES:
                return None
        columns = {name: by_name[name] for name in self.columns if name in by_name}
        return columns, len(rows), context

    def _check_size(self, n: int, what: str) -> None:
        if n > self.max_rows:
            raise ClientError(413, "too_many_rows", f"{n} {what} in one request, at most "
                              f"{self.max_rows} are accepted", field=what,
                              expected=f"at most {self.max_rows} {what}")

    def _parse(self, adapter: TypeAdapter[Any], body: bytes, list_field: str,
               index_name: str) -> Any:
        try:
            return adapter.validate_json(body)
        except ValidationError as exc:
            raise _client_error(exc, list_field, index_name) from None

    def _columns(self, rows: list[dict[str, Value]], index_name: str) -> dict[str, list[Any]]:
        present: set[str] = set()
        for row in rows:
            present.update(row)
        unknown = present - self.known
        if unknown:
            name = sorted(unknown)[0]
            index = next(i for i, r in enumerate(rows) if name in r)
            raise ClientError(422, "unknown_feature", f"{index_name} {index}: feature "
                              f"{name!r} is not an input of the model", field=name, row=index,
                              index_name=index_name, expected=f"one of {self.columns}")
        return {name: [row.get(name) for row in rows] for name in self.columns
                if name in present}


def _client_error(exc: ValidationError, list_field: str, index_name: str) -> ClientError:
    error = exc.errors(include_url=False)[0]
    kind, loc = error["type"], tuple(error["loc"])
    if kind in ("json_invalid", "json_type"):
        return ClientError(400, "invalid_json", f"the body is not valid JSON: {error['msg']}",
                           expected="a JSON object")
    if not loc:
        return ClientError(422, "invalid_body", f"the body must be a JSON object "
                           f"({error['msg']})", expected=f"an object with {list_field!r}")
    field = str(loc[0])
    if kind == "missing":
        return ClientError(422, "missing_field", f"the body has no {field!r}", field=field,
                           expected="a list of objects" if field == list_field else None)
    if kind == "extra_forbidden":
        return ClientError(422, "unknown_field", f"the body has an unknown field {field!r}",
                           field=field, expected=f"only {list_field!r}" +
                           (" and 'context'" if list_field == "candidates" else ""))
    if field == list_field and len(loc) == 1:
        if kind == "too_short":
            return ClientError(422, "empty", f"{list_field!r} holds no {index_name}",
                               field=list_field, expected=f"at least one {index_name}")
        return ClientError(422, "wrong_type", f"{list_field!r} must be a list of objects "
                           f"({error['msg']})", field=list_field, expected="a list of objects")
    if field == list_field and len(loc) == 2:
        return ClientError(422, "wrong_type", f"{index_name} {loc[1]} is not a JSON object",
                           field=list_field, row=int(loc[1]), index_name=index_name,
                           expected="an object of feature -> value")
    if field == list_field:
        feature = str(loc[2])
        return ClientError(422, "wrong_type", f"{index_name} {loc[1]}, feature {feature!r}: "
                           f"{error['msg']}", field=feature, row=int(loc[1]),
                           index_name=index_name, expected=EXPECTED_VALUE)
    if field == "context" and len(loc) >= 2:
        return ClientError(422, "wrong_type", f"context feature {loc[1]!r}: {error['msg']}",
                           field=f"context.{loc[1]}", expected=EXPECTED_VALUE)
    return ClientError(422, "wrong_type", f"{field}: {error['msg']}", field=field,
                       expected="a JSON object of feature -> value")


def count_missing(columns: Mapping[str, Sequence[Any]], names: Collection[str], n: int
                  ) -> dict[str, int]:
    """Missing values per input column (absent columns: every row)."""
    return {name: values.count(None) if (values := columns.get(name)) is not None else n
            for name in names}


def encode_response(scores: Any, model: Mapping[str, Any], request_id: str) -> bytes:
    """The JSON body of scored rows: scores in row order, the model that scored them.

    Scores are written as Python floats (``tolist``), the digits ``json.dumps`` writes: a
    client reads back the float32 score exactly."""
    return orjson.dumps({"scores": scores.tolist(), "model": model,
                         "request_id": request_id})
