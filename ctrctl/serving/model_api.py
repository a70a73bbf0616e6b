"""The one place the server meets the artifact's loader (``serving.py``, the standalone loader).

The server codes against four calls of a loaded model: ``input_columns()``,
``encode_columns(columns, n_rows) -> (dense, ids, lengths)``, ``score_columns(columns,
n_rows)`` and the loader's ``InputError`` (an ``ArtifactError`` with ``feature``, ``row`` and
``expected``). A loader that has them (the vectorised, column-by-column encoder) is called
directly. An older loader has only ``encode(records)``: this module builds the same calls on
it, row dicts in between (the same ids, only slower), and finds the row and feature of a bad
value by encoding the request again row by row, which costs time on the error path only.

Example:
    >>> columns = {"I1": ["3", None], "C1": ["68fd1e64", "0"]}
    >>> dense, ids, lengths = encode_columns(model, columns, 2)
    >>> score_columns(model, columns, 2)                          # array([0.03, 0.12])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ctrctl.inference import standalone

ArtifactError = standalone.ArtifactError


def _input_error_class() -> type[Exception]:
    loader_class = getattr(standalone, "InputError", None)
    if loader_class is not None:
        return loader_class  # type: ignore[no-any-return]

    class _InputError(ArtifactError):  # type: ignore[valid-type,misc]
        """A raw value the encoder cannot read: which feature, which row, what was expected."""

        def __init__(self, message: str, feature: str | None = None, row: int | None = None,
                     expected: str | None = None) -> None:
            super().__init__(message)
            self.feature = feature
            self.row = row
            self.expected = expected

    return _InputError


InputError: Any = _input_error_class()  # the loader's class where it has one


def input_error(message: str, *, feature: str | None = None, row: int | None = None,
                expected: str | None = None) -> Exception:
    """An :data:`InputError` with its three attributes, whatever its constructor takes."""
    try:
        error = InputError(message, feature=feature, row=row, expected=expected)
    except TypeError:
        error = InputError(message)
    error.feature, error.row, error.expected = feature, row, expected
    return error  # type: ignore[no-any-return]


def input_columns(model: Any) -> list[str]:
    """The raw columns the model reads: dense features, then sparse ones, contract order."""
    if hasattr(model, "input_columns"):
        return list(model.input_columns())
    contract = model.contract
    return [f["name"] for f in contract["dense"]] + [f["name"] for f in contract["sparse"]]


def encode_columns(model: Any, columns: Mapping[str, Sequence[Any]], n_rows: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw columns (feature -> one value per row, ``None`` missing) -> model inputs.

    Raises:
        InputError: a value the encoder cannot read, with its feature and row.
    """
    if hasattr(model, "encode_columns"):
        return model.encode_columns(columns, n_rows)  # type: ignore[no-any-return]
    records = _records(columns, n_rows)
    try:
        return model.encode(records)  # type: ignore[no-any-return]
    except ArtifactError as exc:
        raise _locate(model, records, exc) from None


def score_columns(model: Any, columns: Mapping[str, Sequence[Any]], n_rows: int) -> np.ndarray:
    """Click probabilities (n_rows,) float32 for raw columns."""
    if hasattr(model, "score_columns"):
        return np.asarray(model.score_columns(columns, n_rows))
    return model.score(*encode_columns(model, columns, n_rows)).numpy()  # type: ignore[no-any-return]


def _records(columns: Mapping[str, Sequence[Any]], n_rows: int) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = [{} for _ in range(n_rows)]
    for name, values in columns.items():
        for record, value in zip(records, values, strict=True):
            if value is not None:
                record[name] = value
    return records


def _expected(model: Any, feature: str) -> str:
    contract = model.contract
    if any(f["name"] == feature for f in contract["dense"]):
        return "a number (or null for missing)"
    for f in contract["sparse"]:
        if f["name"] == feature:
            kind = f.get("type", "id")
            if f["mode"] == "id":
                return f"an integer id in [0, {f['num_embeddings']})"
            return {"hex": "a hexadecimal string", "int": "an integer",
                    "id": "an integer"}.get(kind, "a string")
    return "a known feature"


def _locate(model: Any, records: list[dict[str, Any]], exc: Exception) -> Exception:
    """The first row and feature that ``model.encode`` refuses, as an :class:`InputError`."""
    for row, record in enumerate(records):
        for feature, value in record.items():
            try:
                model.encode([{feature: value}])
            except ArtifactError as single:
                return input_error(f"row {row}, feature {feature!r}: {single}",
                                   feature=feature, row=row,
                                   expected=_expected(model, feature))
    return input_error(str(exc))
