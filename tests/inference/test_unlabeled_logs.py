"""Serving logs without the label column (Criteo's unlabeled test.txt: 39 fields, not 40)
score through ``ctrctl predict --input`` as the same rows with labels do, into a file of
scores only, which ``ctrctl eval --predictions`` refuses clearly."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from ctrctl.cli.app import main
from ctrctl.config import load_config
from ctrctl.data.preprocess import preprocess
from ctrctl.data.readers import has_label_column, scan_input
from ctrctl.data.schema import load_schema
from ctrctl.data.synthetic import synthesize
from ctrctl.inference.export import write_artifact
from ctrctl.inference.predictor import predict_raw
from ctrctl.inference.quantize import QuantizeConfig, quantize_checkpoint
from ctrctl.testing.threads import torch_threads
from ctrctl.training.loop import train

from .conftest import OVERRIDES

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Exported:
    export: Path
    test_tsv: Path


@pytest.fixture(scope="module")
def criteo(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    root = tmp_path_factory.mktemp("unlabeled")
    synthesize(root / "logs", rows=1200, format="criteo", seed=2,
               splits={"train": 0.75, "test": 0.25})
    dataset = root / "dataset"
    preprocess(ROOT / "schemas" / "criteo_vocab.yaml",
               [f"train={root / 'logs' / 'train.tsv'}", f"test={root / 'logs' / 'test.tsv'}"],
               dataset, on_bad_rows="skip")
    with torch_threads(1):
        run = train(dataset, root / "run", load_config(None, [*OVERRIDES, "training.epochs=1"]))
        quantized = quantize_checkpoint(run.checkpoint, QuantizeConfig(dtype="int8"))
    return Exported(write_artifact(quantized, root / "export", dataset=dataset),
                    root / "logs" / "test.tsv")


def _without_label(labeled: Path, out: Path) -> Path:
    """The rows of ``labeled`` with their first field (the label) cut: 39 fields."""
    out.write_text("".join(line.split("\t", 1)[1] + "\n"
                           for line in labeled.read_text().splitlines()))
    return out


def _scores(path: Path) -> torch.Tensor:
    return torch.from_numpy(pq.read_table(path).column("score").to_numpy().copy())


def test_logs_without_labels_score_as_with_them(criteo: Exported, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    # Well-formed rows only: the labeled file goes through preprocess's own path.
    lines = [line for line in criteo.test_tsv.read_text().splitlines()
             if line.count("\t") == 39]
    labeled = tmp_path / "raw.tsv"
    labeled.write_text("\n".join(lines) + "\n")
    unlabeled = _without_label(labeled, tmp_path / "raw_nolabel.tsv")
    with_labels, without = tmp_path / "labeled.parquet", tmp_path / "s.parquet"
    for raw, out in ((labeled, with_labels), (unlabeled, without)):
        code = main(["predict", "--model", str(criteo.export), "--input", str(raw),
                     "--out", str(out), "--no-track"])
        err = capsys.readouterr().err
        assert code == 0, err
    assert "scores only" in err
    assert pq.read_table(with_labels).column_names == ["label", "score"]
    assert pq.read_table(without).column_names == ["score"]
    assert pq.read_table(without).num_rows == len(lines)
    torch.testing.assert_close(_scores(without), _scores(with_labels))
    # The same reader and encoder with the label column give the very same scores.
    encoded = predict_raw(criteo.export, labeled, tmp_path / "encoded.parquet", via="encoder")
    assert encoded.has_labels
    assert torch.equal(_scores(without), _scores(tmp_path / "encoded.parquet"))

    # Scores without labels cannot be evaluated: one clear line.
    assert main(["eval", "--predictions", str(without), "--out", str(tmp_path / "eval"),
                 "--no-track"]) == 1
    assert "scores but no labels" in capsys.readouterr().err


def test_a_header_without_the_label_name_marks_unlabeled_logs(tmp_path: Path) -> None:
    schema = load_schema(ROOT / "schemas" / "avazu.yaml")
    names = [c.name for c in schema.columns]
    row = {c.name: "1" if c.role == "label" else "10" for c in schema.columns}
    labeled, unlabeled = tmp_path / "labeled.csv", tmp_path / "unlabeled.csv"
    labeled.write_text(",".join(names) + "\n" + ",".join(row[n] for n in names) + "\n")
    kept = [n for n in names if n != schema.label]
    unlabeled.write_text(",".join(kept) + "\n" + ",".join(row[n] for n in kept) + "\n")
    assert has_label_column(schema, labeled) and not has_label_column(schema, unlabeled)
    scan = scan_input(schema, unlabeled, labeled=False)
    frame = scan.frame.collect()
    assert scan.header_lines == 1 and schema.label not in frame.columns
    assert frame.row(0, named=True)[kept[-1]] == "10"

    criteo = load_schema(ROOT / "schemas" / "criteo.yaml")
    full = "\t".join(["1", *["5"] * 13, *["68fd1e64"] * 26])
    (tmp_path / "a.tsv").write_text(full + "\n" + full + "\n")
    (tmp_path / "b.tsv").write_text(full.split("\t", 1)[1] + "\n")
    # One short row among whole ones is a bad row of a labeled file, not unlabeled logs.
    (tmp_path / "c.tsv").write_text(full.split("\t", 1)[1] + "\n" + full + "\n")
    assert has_label_column(criteo, tmp_path / "a.tsv")
    assert not has_label_column(criteo, tmp_path / "b.tsv")
    assert has_label_column(criteo, tmp_path / "c.tsv")
