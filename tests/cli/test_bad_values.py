"""Values that cannot work are refused up front, in one line, and nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_app import CTRCTL, error_lines, run


@pytest.mark.parametrize("args,code,needle", [
    (["train", "--dataset", "ds", "--out", "r", "--nproc-per-node", "0"], 2, "nproc-per-node"),
    (["train", "--dataset", "ds", "--out", "r", "--nnodes", "0"], 2, "nnodes"),
    (["eval", "--predictions", "p.parquet", "--out", "r", "--nproc-per-node", "0"], 2,
     "nproc-per-node"),
    (["train", "--dataset", "ds", "--out", "r", "model.embedding_dim=0"], 1, "embedding_dim"),
])
def test_impossible_values(tmp_path: Path, args: list[str], code: int, needle: str) -> None:
    done = run([CTRCTL, *args, "--no-track"], tmp_path)
    assert done.returncode == code, done.stderr
    assert needle in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("text,needle", [
    ("tables:\n  - name: t\n    num_embeddings: 10\n    embedding_dim: 8\n    colour: red\n",
     "colour"),
    ("tabels:\n  - name: t\n    num_embeddings: 10\n", "tabels"),
    ("embedding_dim: 8\nnum_embeddings_per_feature: [10, 20]\nbatch: 3\n", "batch"),
])
def test_unknown_keys_in_a_tables_yaml(tmp_path: Path, text: str, needle: str) -> None:
    (tmp_path / "t.yaml").write_text(text)
    done = run([CTRCTL, "plan", "--tables", "t.yaml", "--no-track"], tmp_path)
    lines = error_lines(done.stderr)
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "unknown keys" in lines[0] and needle in lines[0] and "t.yaml" in lines[0]
