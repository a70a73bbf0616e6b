"""The serving artifact as an MLflow model: a pyfunc flavor over the same files.

The python model (:mod:`ctrctl.inference.pyfunc_model`, logged as code) loads the artifact
with its standalone loader, so the MLflow model needs no ctrctl; the signature names every
raw column of the input contract (dense as double, categorical as the log's text, a
timestamp column such as Avazu's ``hour`` in place of the features derived from it), and an
input example of a few rows travels with it. Unknown columns, bad values, ragged rows,
unnamed (tensor) inputs and requests over ``max_rows`` rows are refused (a 400 from
``mlflow models serve``): see :mod:`ctrctl.inference.pyfunc_model`.

Example:
    >>> info = log_pyfunc_model("export", run_id=run.run_id)
    >>> mlflow.pyfunc.load_model(info.model_uri).predict(frame)     # (rows,) probabilities
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ctrctl.inference import standalone

#: The python model, logged as code (never imported here: it registers itself when run).
MODEL_CODE = Path(__file__).with_name("pyfunc_model.py")

#: What the MLflow model needs at serving time (the environment is the caller's with
#: ``--env-manager local``; these are recorded for others).
REQUIREMENTS = ["torch", "safetensors", "numpy", "pandas", "mlflow"]


def _signature_and_example(manifest: dict[str, Any]) -> tuple[Any, Any]:
    """The signature lists the raw columns a request carries (the contract's ``columns``:
    Avazu's ``hour`` as ``YYMMDDHH``, not the features derived from it): dense as double,
    raw categoricals as the log's text (string), ids as long (a dataset without a schema).
    """
    import pandas as pd
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    from ctrctl.inference.standalone_encoder import raw_columns

    contract = manifest["input"]
    dense = {d["name"] for d in contract["dense"]}
    sparse = {f["name"]: f for f in contract["sparse"]}
    sources = {f["derive"]["column"]: f["derive"] for f in contract["sparse"] if "derive" in f}
    columns: list[Any] = []
    example: dict[str, list[Any]] = {}
    for name in raw_columns(contract):
        if name in dense:
            columns.append(ColSpec("double", name, required=False))
            example[name] = [1.0, 0.0]
        elif name in sources:
            columns.append(ColSpec("string", name, required=False))
            example[name] = [_example_stamp(sources[name]["format"]), None]
        elif sparse[name].get("type", "id") == "id":
            columns.append(ColSpec("long", name, required=False))
            example[name] = [0, 1 % int(sparse[name]["num_embeddings"])]
        else:
            columns.append(ColSpec("string", name, required=False))
            kind = sparse[name].get("type")
            example[name] = ["1a2b3c4d" if kind == "hex" else "12" if kind == "int" else "a",
                             None]
    outputs = Schema([ColSpec("double")])
    return ModelSignature(inputs=Schema(columns), outputs=outputs), pd.DataFrame(example)


def _example_stamp(fmt: str) -> str:
    import datetime

    return datetime.datetime(2014, 10, 21, 9).strftime(fmt)


def log_pyfunc_model(artifact: str | Path, *, run_id: str | None = None,
                     tracking_uri: str | None = None, name: str = "model") -> Any:
    """Log the artifact folder as an MLflow pyfunc model (into ``run_id`` when given).

    Returns:
        MLflow's ``ModelInfo`` (``.model_uri`` loads it).
    """
    import mlflow

    artifact = Path(artifact)
    standalone.verify(str(artifact))
    manifest = json.loads((artifact / standalone.MANIFEST).read_text())
    signature, example = _signature_and_example(manifest)
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    active = mlflow.active_run()
    if run_id is not None and (active is None or active.info.run_id != run_id):
        with mlflow.start_run(run_id=run_id):
            return _log(mlflow, artifact, signature, example, name)
    return _log(mlflow, artifact, signature, example, name)


def _log(mlflow: Any, artifact: Path, signature: Any, example: Any, name: str) -> Any:
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=str(MODEL_CODE),
        artifacts={"export": str(artifact)},
        signature=signature,
        input_example=example,
        pip_requirements=REQUIREMENTS,
    )
