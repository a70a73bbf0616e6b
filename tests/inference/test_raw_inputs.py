"""Raw logs through the input contract: `predict --input`, the standalone loader, the dataset
path and MLflow's frame all give the same scores (hash and vocabulary features, log1p dense)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from ctrctl.config import load_config
from ctrctl.data.preprocess import preprocess
from ctrctl.inference.export import load_artifact, write_artifact
from ctrctl.inference.predictor import predict_dataset, predict_raw
from ctrctl.inference.quantize import QuantizeConfig, quantize_checkpoint
from ctrctl.training.loop import train

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_raw_rows_score_as_the_preprocessed_split(criteo_8k: Path, tmp_path: Path) -> None:
    schema = yaml.safe_load((ROOT / "schemas" / "criteo.yaml").read_text())
    for column in schema["columns"]:
        if column.get("role") == "sparse":
            if column["name"] in ("C1", "C2", "C3"):
                column["hash_size"] = 1000  # hash mode
            else:
                column.pop("hash_size", None)
                column["min_count"] = 10  # vocabulary mode
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    dataset = tmp_path / "criteo"
    preprocess(tmp_path / "schema.yaml", [f"train={criteo_8k / 'train.csv'}",
                                          f"test={criteo_8k / 'test.csv'}"], dataset)
    run = train(dataset, tmp_path / "run", load_config(
        ROOT / "pipelines" / "criteo-sample.yaml", ["training.epochs=1", "training.val_every=0"]))
    quantized = quantize_checkpoint(run.checkpoint, QuantizeConfig(dtype="int8", num_shards=2))
    export = write_artifact(quantized, tmp_path / "export", dataset=dataset)

    predict_dataset(export, dataset, "test", tmp_path / "split.parquet")
    predict_raw(export, criteo_8k / "test.csv", tmp_path / "raw.parquet")
    split = pq.read_table(tmp_path / "split.parquet")
    raw = pq.read_table(tmp_path / "raw.parquet")
    assert np.array_equal(split.column("score").to_numpy(), raw.column("score").to_numpy())
    assert np.array_equal(split.column("label").to_numpy(), raw.column("label").to_numpy())

    names = [c["name"] for c in schema["columns"]]
    with open(criteo_8k / "test.csv", newline="") as handle:
        records = [dict(zip(names, row, strict=True))
                   for row in csv.reader(handle, delimiter="\t")]
    serving = load_artifact(export)
    mine = torch.tensor(serving.predict_records(records))
    torch.testing.assert_close(mine, torch.from_numpy(split.column("score").to_numpy().copy()))
