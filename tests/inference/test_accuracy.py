"""INT8 and INT4 tables cost at most 0.001 and 0.005 AUC against the FP32 checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ctrctl.config import load_config
from ctrctl.data.preprocess import preprocess
from ctrctl.inference.accuracy import dtype_accuracy
from ctrctl.testing.datasets import make_dataset
from ctrctl.training.loop import train

ROOT = Path(__file__).resolve().parents[2]
BOUNDS = {"int8": 0.001, "int4": 0.005}


def _check(rows: list[dict[str, object]]) -> None:
    by_dtype = {r["dtype"]: r for r in rows}
    for dtype, bound in BOUNDS.items():
        loss = float(by_dtype[dtype]["auc_loss"])  # type: ignore[arg-type]
        assert loss <= bound, f"{dtype} loses {loss:.5f} AUC (bound {bound})"
    # The scores did change: the comparison is not of a model with itself.
    assert by_dtype["int4"]["logloss"] != by_dtype["fp32"]["logloss"]


@pytest.mark.slow
def test_quantized_auc_on_criteo_sample(criteo_8k: Path, tmp_path: Path) -> None:
    schema = yaml.safe_load((ROOT / "schemas" / "criteo.yaml").read_text())
    for column in schema["columns"]:
        if column.get("role") == "sparse":
            column.pop("hash_size", None)
            column["min_count"] = 10
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(schema))
    dataset = tmp_path / "criteo"
    preprocess(tmp_path / "schema.yaml", [f"train={criteo_8k / 'train.csv'}",
                                          f"val={criteo_8k / 'dev.csv'}",
                                          f"test={criteo_8k / 'test.csv'}"], dataset)
    result = train(dataset, tmp_path / "run",
                   load_config(ROOT / "pipelines" / "criteo-sample.yaml"))
    _check(dtype_accuracy(result.checkpoint, dataset, ("val", "test"), ("int8", "int4")))


@pytest.mark.slow
def test_quantized_auc_on_synthetic_data(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "ds", {"train": 10_000, "val": 500, "test": 4_000},
                        num_dense=13, num_sparse=26, num_embeddings=2000, seed=7)
    config = load_config(None, [
        "model.embedding_dim=16", "model.dense_arch=[64,16]", "model.over_arch=[64,1]",
        "training.batch_size=256", "training.epochs=2", "training.val_every=0",
        "training.checkpoint_every=0", "training.num_workers=1", "training.device=cpu"])
    result = train(data.path, tmp_path / "run", config)
    _check(dtype_accuracy(result.checkpoint, data.path, ("test",), ("int8", "int4")))
