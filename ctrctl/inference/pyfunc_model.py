"""The MLflow pyfunc model over a serving artifact (models-from-code; needs no ctrctl).

MLflow stores this file with the model and runs it on load; the artifact folder travels as
the model's artifact ``export`` and its own loader (``serving.py``, loaded by file path)
does the work, so ``mlflow.pyfunc.load_model(uri).predict(frame)`` and ``mlflow models
serve`` need torch, numpy, safetensors, fbgemm_gpu (when the program uses it), pandas and
mlflow only.

Not imported by ctrctl (it registers the model when run); its path is handed to MLflow.

Input: a pandas frame of raw log columns, as the signature lists them (missing columns and
empty values are missing values). Output: one click probability per row. Refused, as an
``MlflowException`` (``INVALID_PARAMETER_VALUE``: a 400 from ``mlflow models serve``) whose
message names the column, the row and what was expected:

- a column the model does not know (misspelled, lower-cased): MLflow's schema check drops
  such columns with a warning before ``predict`` sees the frame; this model notes the
  warning (a filter on MLflow's logger) and refuses the request instead;
- a value the encoder refuses (not a number, not hex, a list where a scalar belongs);
- unnamed columns (the tensor ``inputs`` form);
- a ragged ``dataframe_split`` row (pandas pads it with missing values: made an error);
- more than ``max_rows`` rows (default 10,000).

Model config: ``compile`` (default false) compiles the program with TorchInductor at load
(``serving.load``'s ``compile``); ``max_rows`` bounds the rows of one request (also from the
environment variable ``CTRCTL_PYFUNC_MAX_ROWS``), e.g.
``mlflow.pyfunc.load_model(uri, model_config={"compile": True, "max_rows": 50000})``;
``verify_key`` (or the environment's ``CTRCTL_VERIFY_KEY``), a key file's path, requires the
artifact's signature (``ctrctl quantize --sign``).
"""

import ast
import logging
import os
import sys
import threading
import types
import warnings

import mlflow
import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from mlflow.pyfunc import PythonModel

#: Rows one request may hold unless configured (a 270-row request is about 0.1 MB of JSON;
#: 10,000 rows take about 2 s and 0.3 GB at one core, so a request cannot exhaust memory).
DEFAULT_MAX_ROWS = 10_000
#: What MLflow's schema check logs for columns it drops (mlflow.models.utils).
EXTRA_COLUMNS = "Found extra inputs in the model input that are not defined in the model " \
                "signature: `"
_dropped = threading.local()


class _DroppedColumns(logging.Filter):
    """Notes the columns MLflow's schema check drops, for :meth:`predict` to refuse."""

    def filter(self, record):
        message = record.getMessage()
        if message.startswith(EXTRA_COLUMNS):
            try:
                _dropped.columns = ast.literal_eval(message[len(EXTRA_COLUMNS):]
                                                    .split("`", 1)[0])
            except (ValueError, SyntaxError):
                _dropped.columns = [message[len(EXTRA_COLUMNS):].split("`", 1)[0]]
        return True


def _refuse(message):
    return MlflowException(message, error_code=INVALID_PARAMETER_VALUE)


class ServingArtifactModel(PythonModel):
    """Scores raw rows with the artifact in ``context.artifacts["export"]``."""

    def load_context(self, context):
        folder = context.artifacts["export"]
        serving = load_loader(folder)
        config = getattr(context, "model_config", None) or {}
        key = config.get("verify_key") or os.environ.get("CTRCTL_VERIFY_KEY") or None
        # (an artifact's loader from before signatures takes no verify_key: passed only if set)
        self.model = serving.load(folder, compile=bool(config.get("compile", False)),
                                  **({"verify_key": key} if key else {}))
        self.input_error = serving.InputError
        self.max_rows = int(config.get("max_rows") or
                            os.environ.get("CTRCTL_PYFUNC_MAX_ROWS") or DEFAULT_MAX_ROWS)
        utils_logger = logging.getLogger("mlflow.models.utils")
        if not any(isinstance(f, _DroppedColumns) for f in utils_logger.filters):
            utils_logger.addFilter(_DroppedColumns())
        # pandas pads a ragged dataframe_split row with NaN (deprecated): make it an error,
        # which MLflow's parser reports as a 400 naming it.
        warnings.filterwarnings("error", message="Constructing a DataFrame from a list of "
                                "sequences with mismatched lengths")

    # The frame's hint: MLflow checks the logged signature (it infers none from the hint).
    def predict(self, context, model_input: pd.DataFrame, params=None):
        dropped, _dropped.columns = getattr(_dropped, "columns", None), None
        if not isinstance(model_input, pd.DataFrame):
            raise _refuse(f"expected a frame of named raw columns (dataframe_split or "
                          f"dataframe_records), got {type(model_input).__name__}")
        rows = len(model_input)
        if rows > self.max_rows:
            raise _refuse(f"{rows:,} rows in one request: at most {self.max_rows:,} "
                          "(model_config max_rows, or CTRCTL_PYFUNC_MAX_ROWS)")
        columns = {name: model_input[name].to_numpy() for name in model_input.columns}
        for name in dropped or ():
            columns[name] = np.full(rows, None, dtype=object)  # refused by name below
        try:
            scores = self.model.score_columns(columns, rows)
        except self.input_error as exc:
            raise _refuse(str(exc)) from None
        return np.asarray(scores, dtype=np.float64)


def load_loader(folder):
    """The artifact's ``serving.py``, run from its source text: the folder never goes on
    ``sys.path`` (a module planted there would be imported) and no ``__pycache__`` is read
    or written in it. The loader then checks every file of the folder."""
    path = os.path.join(folder, "serving.py")
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    module = types.ModuleType("ctrctl_artifact_serving")
    module.__file__ = path
    sys.modules[module.__name__] = module
    exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102  (the artifact's loader)
    return module


mlflow.models.set_model(ServingArtifactModel())
