"""ctrctl synth --format two_tower: planted factors, a log leave-last-out can split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from ctrctl.cli.app import app
from ctrctl.data.preprocess import preprocess
from ctrctl.retrieval.synthetic import plant_factors


def test_planted_factors_are_unit_vectors() -> None:
    factors = plant_factors(100, 8, seed=3)
    np.testing.assert_allclose(np.linalg.norm(factors, axis=1), 1.0, rtol=1e-5)
    assert not np.allclose(factors, plant_factors(100, 8, seed=4))


def test_synth_two_tower_writes_a_log_its_schema_splits(tmp_path: Path) -> None:
    out = tmp_path / "logs"
    result = CliRunner().invoke(app, [
        "synth", "--format", "two_tower", "--rows", "3000", "--cardinality", "users=300",
        "--cardinality", "items=400", "--out", str(out), "--no-track"])
    assert result.exit_code == 0, result.output
    lines = (out / "interactions.tsv").read_text().splitlines()
    assert len(lines) == 3000
    pairs = {tuple(line.split("\t")[:2]) for line in lines}
    assert len(pairs) == 3000  # a user's items are distinct
    manifest = preprocess(out / "schema.yaml", [str(out / "interactions.tsv")], tmp_path / "ds")
    assert {k: v.rows for k, v in manifest.splits.items()} == {
        "train": 2400, "val": 300, "test": 300}
    assert "oracle" in result.output
