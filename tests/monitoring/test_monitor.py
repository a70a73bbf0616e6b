"""``ctrctl monitor`` on a dataset split and on served traffic joined with later labels."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctrctl.data.reference import REFERENCE_FILE
from ctrctl.monitoring import monitor
from ctrctl.testing.threads import torch_threads
from tests.serving.conftest import Exported, build_export, running

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    with torch_threads(1):
        return build_export(tmp_path_factory.mktemp("monitored"))


def test_the_export_carries_its_training_statistics(exported: Exported) -> None:
    stats = json.loads((exported.export / "dataset" / REFERENCE_FILE).read_text())
    manifest = json.loads((exported.export / "manifest.json").read_text())
    assert f"dataset/{REFERENCE_FILE}" in json.dumps(manifest)  # listed, hashed, verified
    assert stats["rows"] == json.loads((exported.dataset / "manifest.json").read_text())[
        "splits"]["train"]["rows"]
    assert set(stats["dense"]) == {f"I{i}" for i in range(1, 14)}
    assert sum(stats["sparse"]["C1"]["shares"]) + stats["sparse"]["C1"]["other"] == \
        pytest.approx(1.0)
    # the exported model's scores on the same rows: the scores' reference
    assert sum(stats["score"]["shares"]) == pytest.approx(1.0)
    assert 0.0 < stats["score"]["mean"] < 1.0


def test_monitor_on_a_split_with_checkpoint_and_export(exported: Exported, tmp_path: Path
                                                       ) -> None:
    with torch_threads(1):
        a = monitor(str(exported.export), tmp_path / "a", dataset=exported.dataset,
                    split="train", segment_by="C6")
        b = monitor(str(exported.export.parent / "run"), tmp_path / "b",
                    dataset=exported.dataset, split="test")
    # the training split against its own statistics: no drift
    assert a.metrics["psi"]["max"] < 0.01
    assert a.metrics["score"]["psi"] < 0.01  # the same model on the same rows
    assert a.metrics["rows"] == a.metrics["labelled_rows"] > 0
    assert 0.5 < a.metrics["auc"] <= 1.0 and a.metrics["segments"]
    assert (tmp_path / "a" / "reliability.png").is_file() and (tmp_path / "a" / "psi.png").is_file()
    assert b.metrics["model"]["kind"] == "checkpoint" and b.metrics["psi"]["max"] > 0
    assert b.metrics["score"]["psi"] is not None


def test_cli_gate_breach_exits_3(exported: Exported, tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "ctrctl", "monitor", "--model", str(exported.export),
            "--dataset", str(exported.dataset), "--split", "test", "--no-track"]
    done = subprocess.run([*args, "--out", str(tmp_path / "o"), "--gate", "psi.max<=0.000001",
                           "--gate", "calibration=1.0+-100"], env=env, capture_output=True,
                          text=True, timeout=240, check=False)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "psi.max<=1e-06: FAILED" in done.stdout + done.stderr
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["gates"][0]["passed"] \
        is False


def test_monitor_on_served_traffic_reports_the_served_calibration(
        exported: Exported, tmp_path: Path) -> None:
    records = exported.records()
    with open(exported.raw, newline="") as handle:
        clicks = [int(row[0]) for row in csv.reader(handle, delimiter="\t")]
    logs = tmp_path / "logs"
    served: list[float] = []
    label_rows: list[tuple[str, int, int]] = []
    with running(exported.export, "--log-dir", str(logs)) as http:
        for start in range(0, len(records), 64):
            request_id = f"req-{start}"
            status, body, _ = http.post("/v1/score", {"rows": records[start:start + 64]},
                                        headers={"X-Request-Id": request_id})
            assert status == 200, body
            served += body["scores"]
            label_rows += [(request_id, i, clicks[start + i])
                           for i in range(len(body["scores"]))]
        code, _ = http.stop()  # flushes the request log
    assert code == 0
    labels = tmp_path / "clicks.parquet"
    late = label_rows[: len(label_rows) * 3 // 4]  # a quarter of the labels has not arrived
    pq.write_table(pa.table({"request_id": [r[0] for r in late], "row": [r[1] for r in late],
                             "label": [r[2] for r in late]}), labels)
    with torch_threads(1):
        result = monitor(str(exported.export), tmp_path / "out", requests=logs, labels=labels,
                         segment_by="C6", gates=["calibration=1.0+-100"])
    m = result.metrics
    scores = np.array(served[: len(late)])
    y = np.array([r[2] for r in late])
    assert m["join"]["joined"] == len(late) and m["join"]["logged"] == len(records)
    assert m["calibration"] == pytest.approx(scores.sum() / y.sum(), rel=1e-6)
    assert m["mean_score"] == pytest.approx(scores.mean(), rel=1e-6)
    assert m["rows"] == len(records) and m["psi"]["max"] is not None
    assert m["features"]["I1"]["missing_rate"] == pytest.approx(
        sum("I1" not in r for r in records) / len(records))
    assert m["staleness_s"]["requests"] < 600
