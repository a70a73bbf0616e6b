"""The serving artifact as an MLflow model: a pyfunc flavor over the same files.

The python model (:mod:`ctrctl.inference.pyfunc_model`, logged as code) loads the artifact
with its standalone loader, so the MLflow model needs no ctrctl; the signature names every
raw feature of the input contract (dense as double, categorical as string or long), and an
input example of a few rows travels with it.

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
    import pandas as pd
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, Schema

    contract = manifest["input"]
    columns: list[Any] = [ColSpec("double", d["name"], required=False) for d in contract["dense"]]
    example: dict[str, list[Any]] = {d["name"]: [1.0, 0.0] for d in contract["dense"]}
    for f in contract["sparse"]:
        if f.get("type") in ("hex", "string"):
            columns.append(ColSpec("string", f["name"], required=False))
            example[f["name"]] = ["1a2b3c4d", None] if f.get("type") == "hex" else ["a", None]
        else:
            columns.append(ColSpec("long", f["name"], required=False))
            example[f["name"]] = [0, 1 % int(f["num_embeddings"])]
    outputs = Schema([ColSpec("double")])
    return ModelSignature(inputs=Schema(columns), outputs=outputs), pd.DataFrame(example)


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
