"""``ctrctl predict`` streams: raw logs through the column encoder (``via="encoder"``) and
a split through its row groups score as the preprocessed split does, chunk by chunk, and a
bad row names its file, line and column (no partial scores file is left)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from ctrctl.config import load_config
from ctrctl.data.preprocess import preprocess
from ctrctl.data.synthetic import synthesize
from ctrctl.errors import DatasetError
from ctrctl.inference import batch_scoring
from ctrctl.inference.export import write_artifact
from ctrctl.inference.predictor import predict_dataset, predict_raw
from ctrctl.inference.quantize import QuantizeConfig, quantize_checkpoint
from ctrctl.testing.threads import torch_threads
from ctrctl.training.loop import train

from .conftest import OVERRIDES

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Exported:
    export: Path
    dataset: Path
    test_tsv: Path


@pytest.fixture(scope="module")
def criteo(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    root = tmp_path_factory.mktemp("criteo")
    synthesize(root / "logs", rows=2500, format="criteo", seed=1,
               splits={"train": 0.8, "test": 0.2})
    dataset = root / "dataset"
    preprocess(ROOT / "schemas" / "criteo.yaml", [f"train={root / 'logs' / 'train.tsv'}",
                                                   f"test={root / 'logs' / 'test.tsv'}"],
               dataset)
    with torch_threads(1):
        run = train(dataset, root / "run", load_config(None, [*OVERRIDES, "training.epochs=1"]))
        quantized = quantize_checkpoint(run.checkpoint, QuantizeConfig(dtype="int8"))
    return Exported(write_artifact(quantized, root / "export", dataset=dataset), dataset,
                    root / "logs" / "test.tsv")


@pytest.mark.slow
def test_raw_logs_stream_in_chunks_and_score_as_the_split(
        criteo: Exported, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    writes: list[int] = []
    original = batch_scoring.ScoresWriter.write

    def counted(self: batch_scoring.ScoresWriter, labels: np.ndarray | None,
                scores: np.ndarray) -> None:
        writes.append(len(scores))
        original(self, labels, scores)

    monkeypatch.setattr(batch_scoring.ScoresWriter, "write", counted)
    raw = predict_raw(criteo.export, criteo.test_tsv, tmp_path / "raw.parquet", batch_size=97,
                      via="encoder")
    assert raw.rows == 500 and max(writes) <= 97 and sum(writes) == 500
    split = predict_dataset(criteo.export, criteo.dataset, "test", tmp_path / "split.parquet",
                            batch_size=128)
    assert split.rows == 500
    a, b = (pq.read_table(tmp_path / f"{n}.parquet") for n in ("raw", "split"))
    assert a.column("label").to_pylist() == b.column("label").to_pylist()
    torch.testing.assert_close(torch.from_numpy(a.column("score").to_numpy().copy()),
                               torch.from_numpy(b.column("score").to_numpy().copy()))


@pytest.mark.slow
def test_a_bad_value_names_file_line_and_column(criteo: Exported, tmp_path: Path) -> None:
    lines = criteo.test_tsv.read_text().splitlines()
    fields = lines[6].split("\t")
    fields[16] = "not-hex"  # label, I1..I13, C1, C2, C3
    lines[6] = "\t".join(fields)
    bad = tmp_path / "bad.tsv"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match="column 'C3', row 6: expected a hex") as caught:
        predict_raw(criteo.export, bad, tmp_path / "scores.parquet", batch_size=4,
                    via="encoder")
    assert caught.value.where == f"{bad}:7"
    assert list(tmp_path.glob("*.parquet")) == [] and list(tmp_path.glob(".scores*")) == []
    lines[6] = lines[6] + "\textra"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match="too many fields") as caught:
        predict_raw(criteo.export, bad, tmp_path / "scores.parquet", via="encoder")
    assert caught.value.where == f"{bad}:7"
