"""Raw logs through the input contract: `predict --input`, the standalone loader, the dataset
path and MLflow's frame all give the same scores (hash and vocabulary features, log1p dense)."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from ctrctl.config import load_config
from ctrctl.data.manifest import DatasetManifest
from ctrctl.data.preprocess import preprocess
from ctrctl.data.synthetic import synthesize
from ctrctl.errors import DatasetError
from ctrctl.inference.export import load_artifact, write_artifact
from ctrctl.inference.predictor import check_transforms, predict_dataset, predict_raw
from ctrctl.inference.quantize import QuantizeConfig, quantize_checkpoint
from ctrctl.training.loop import train

ROOT = Path(__file__).resolve().parents[2]


def test_new_rows_score_whatever_splits_the_training_dataset_drew(tmp_path: Path) -> None:
    # The CLI carves val from train by default: a model trained on such a dataset once
    # refused every raw file and every --reuse-transforms dataset ("transform parameters
    # differ"), their splits being drawn otherwise.
    from tests.inference.conftest import OVERRIDES

    logs = tmp_path / "logs"
    synthesize(logs, rows=3000, format="criteo", seed=1, splits={"train": 0.8, "test": 0.2})
    dataset = tmp_path / "ds"
    preprocess(ROOT / "schemas" / "criteo_vocab.yaml",
               [f"train={logs / 'train.tsv'}", f"test={logs / 'test.tsv'}"], dataset,
               val_fraction=0.1)  # as `ctrctl preprocess` does without a val input
    run = train(dataset, tmp_path / "run", load_config(None, [*OVERRIDES, "training.epochs=1"]))
    export = write_artifact(quantize_checkpoint(run.checkpoint, QuantizeConfig(dtype="int8")),
                            tmp_path / "export", dataset=dataset)
    predict_dataset(export, dataset, "test", tmp_path / "split.parquet")
    predict_raw(export, logs / "test.tsv", tmp_path / "raw.parquet", on_bad_rows="skip")
    split, raw = (pq.read_table(tmp_path / f"{n}.parquet") for n in ("split", "raw"))
    assert raw.num_rows == 600
    assert np.array_equal(split.column("score").to_numpy(), raw.column("score").to_numpy())

    # New rows split at random by the model's transforms score too ...
    again = tmp_path / "again"
    preprocess(None, [str(logs / "test.tsv")], again, reuse_transforms=export / "dataset",
               split_ratio="0.5,0.25,0.25", seed=4)
    result = predict_dataset(export, again, "val", tmp_path / "again.parquet")
    assert result.rows == DatasetManifest.load(again).splits["val"].rows > 0
    # ... and a dataset with vocabularies of its own does not, whatever its sizes.
    model = DatasetManifest.load(export / "dataset").to_dict()
    unfollowed = replace(DatasetManifest.load(again), follows=None)
    with pytest.raises(DatasetError, match="vocabularies are not the model's"):
        check_transforms(model, unfollowed, str(again))

    # Another polars preprocessed the new rows: no string is hashed here, so it scores ...
    manifest = DatasetManifest.load(again)
    newer = replace(manifest, transforms={**manifest.transforms, "polars_version": "9.9.9"})
    check_transforms(model, newer, str(again))
    # ... but where a string feature is hashed into buckets its ids may differ: refused.
    def string_hashed(m: DatasetManifest) -> DatasetManifest:
        columns = [{**c, "type": "string"} if c.get("name") == "C1" else c
                   for c in m.schema["columns"]]
        return replace(m, sparse=tuple(replace(f, mode="hash") if f.name == "C1" else f
                                       for f in m.sparse),
                       schema={**m.schema, "columns": columns})

    hashed_model = string_hashed(DatasetManifest.load(export / "dataset")).to_dict()
    with pytest.raises(DatasetError, match=r"transforms differ from the model's: "
                                           r"\['polars_version'\]"):
        check_transforms(hashed_model, string_hashed(newer), str(again))


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
