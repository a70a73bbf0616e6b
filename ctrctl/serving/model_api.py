"""The one place the server meets the artifact's loader (``serving.py``, the standalone loader).

The server codes against four calls of a loaded model: ``input_columns()``,
``encode_columns(columns, n_rows) -> (dense, ids, lengths)``, ``score_columns(columns,
n_rows)`` and the loader's ``InputError`` (an ``ArtifactError`` with ``feature``, ``row`` and
``expected``), which the column-by-column encoder (``standalone_encoder.py``) provides.

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
InputError = standalone.InputError


def input_error(message: str, *, feature: str | None = None, row: int | None = None,
                expected: str | None = None) -> InputError:
    """An :data:`InputError` naming the feature, the row and what was expected."""
    return InputError(message, feature=feature, row=row, expected=expected or "")


def input_columns(model: Any) -> list[str]:
    """The raw columns the model reads, in its contract's order."""
    return list(model.input_columns())


def encode_columns(model: Any, columns: Mapping[str, Sequence[Any]], n_rows: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raw columns (feature -> one value per row, ``None`` missing) -> model inputs.

    Raises:
        InputError: a value the encoder cannot read, with its feature and row.
    """
    return model.encode_columns(columns, n_rows)  # type: ignore[no-any-return]


def score_columns(model: Any, columns: Mapping[str, Sequence[Any]], n_rows: int) -> np.ndarray:
    """Click probabilities (n_rows,) float32 for raw columns."""
    return np.asarray(model.score_columns(columns, n_rows))
