"""Managed-collision statistics: per table in metrics.json and the end-of-training report."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from ctrctl.config import load_config
from ctrctl.data.preprocess import preprocess
from ctrctl.data.schema import Schema
from ctrctl.data.synthetic_days import days_schema, synthesize_days
from ctrctl.testing.threads import torch_threads
from ctrctl.training.collision_report import format_collision_report
from ctrctl.training.loop import train

OVERRIDES = [
    "model.embedding_dim=8", "model.dense_arch=[8]", "model.over_arch=[8,1]",
    "training.batch_size=128", "training.epochs=1", "training.num_workers=1",
    "training.device=cpu", "training.checkpoint_every=0", "training.val_every=4",
]


@pytest.mark.slow  # preprocess + a training run with validation: ~20 s
def test_training_reports_zch_statistics(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                         ) -> None:
    logs = synthesize_days(tmp_path / "logs", days=3, rows_per_day=800, new_ids_per_day=100,
                           initial_ids=300, seed=2)
    zch = {"collision": {"kind": "zch", "capacity": 50, "eviction": "lfu"}}
    schema = Schema.from_dict(days_schema(zch, {"hash_size": 64}))
    preprocess(schema, [f"train={logs.files[1]}", f"val={logs.files[2]}",
                        f"test={logs.files[3]}"], tmp_path / "ds")
    with torch_threads(1), caplog.at_level(logging.INFO, logger="ctrctl.training.loop"):
        train(tmp_path / "ds", tmp_path / "run", load_config(None, OVERRIDES))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())["collisions"]
    assert metrics["zch.user.lookups"] == 800  # training lookups only: validation reads
    assert metrics["zch.user.occupancy"] == 1.0
    assert 0 < metrics["zch.user.admissions"] <= metrics["zch.user.distinct_ids"]
    assert 0 < metrics["zch.user.default_rate"] < 1
    assert "managed-collision tables:" in caplog.text and "user: occupancy 100.0%" in caplog.text


def test_the_report_has_one_line_per_table() -> None:
    stats = {"occupancy": 0.5, "lookups": 1000.0, "default_rate": 0.25, "admissions": 40.0,
             "evictions": 3.0, "distinct_ids": 70.0}
    metrics = {f"zch.{t}.{k}": v for t in ("user", "ad") for k, v in stats.items()}
    lines = format_collision_report(metrics).splitlines()
    assert lines[0] == ("  ad: occupancy 50.0%, 1,000 lookups (25.0% to the default row), "
                        "40 admissions, 3 evictions, 70 distinct ids")
    assert len(lines) == 2 and format_collision_report({}) == ""
