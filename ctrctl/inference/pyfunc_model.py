"""The MLflow pyfunc model over a serving artifact (models-from-code; needs no ctrctl).

MLflow stores this file with the model and runs it on load; the artifact folder travels as
the model's artifact ``export`` and its own loader (``serving.py``) does the work, so
``mlflow.pyfunc.load_model(uri).predict(frame)`` and ``mlflow models serve`` need torch,
safetensors, fbgemm_gpu (when the program uses it), pandas and mlflow only.

Not imported by ctrctl (it registers the model when run); its path is handed to MLflow.

Input: a pandas frame of raw feature values, one column per feature of the artifact's
input contract (missing columns and empty values are missing values). Output: one click
probability per row.

Model config: ``compile`` (default false) compiles the program with TorchInductor at load
(``serving.load``'s ``compile``), e.g. ``mlflow.pyfunc.load_model(uri,
model_config={"compile": True})``; ``verify_key`` (or the environment's
``CTRCTL_VERIFY_KEY``), a key file's path, requires the artifact's signature
(``ctrctl quantize --sign``).
"""

import os
import sys
import types

import mlflow
import numpy as np
import pandas as pd
from mlflow.pyfunc import PythonModel


class ServingArtifactModel(PythonModel):
    """Scores raw rows with the artifact in ``context.artifacts["export"]``."""

    def load_context(self, context):
        folder = context.artifacts["export"]
        serving = load_loader(folder)
        config = getattr(context, "model_config", None) or {}
        key = config.get("verify_key") or os.environ.get("CTRCTL_VERIFY_KEY") or None
        self.model = serving.load(folder, compile=bool(config.get("compile", False)),
                                  verify_key=key)

    # The frame's hint: MLflow checks the logged signature (it infers none from the hint).
    def predict(self, context, model_input: pd.DataFrame, params=None):
        frame = model_input.replace({np.nan: None})
        return np.asarray(self.model.predict_records(frame.to_dict("records")),
                          dtype=np.float64)


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
