"""An ``--out`` that is, holds or lies inside a command's own input is refused, even with
``--overwrite`` (``quantize --checkpoint run --out run --overwrite`` deleted the training run).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ctrctl.cli.app import main
from ctrctl.errors import ConfigError
from ctrctl.io import refuse_output_over_inputs
from tests.inference.conftest import Trained, trained  # noqa: F401  (the shared checkpoint)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def copies(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    """A copy of the run, its dataset and an export, so a failure cannot harm the shared ones."""
    root = tmp_path_factory.mktemp("over-inputs")
    shutil.copytree(trained.run, root / "run")
    shutil.copytree(trained.dataset.path, root / "ds")
    assert main(["quantize", "--checkpoint", str(root / "run"), "--dataset", str(root / "ds"),
                 "--out", str(root / "export"), "--no-track"]) == 0
    return root


def _refused(args: list[str], root: Path, capsys: pytest.CaptureFixture[str]) -> str:
    before = {name: _snapshot(root / name) for name in ("run", "ds", "export")}
    assert main([*args, "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert {name: _snapshot(root / name) for name in before} == before  # nothing touched
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("out", ["run", "run/checkpoints", "."])
def test_quantize_refuses_its_own_checkpoint(out: str, copies: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(["quantize", "--checkpoint", str(copies / "run"), "--dataset",
                     str(copies / "ds"), "--out", str(copies / out), "--no-track"],
                    copies, capsys)
    assert "--out" in line and str(copies / "run") in line and "outside" in line


@pytest.mark.parametrize("out", ["run", "ds"])
def test_eval_refuses_its_own_checkpoint_and_dataset(out: str, copies: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    line = _refused(["eval", "--checkpoint", str(copies / "run"), "--dataset",
                     str(copies / "ds"), "--out", str(copies / out), "--no-track"],
                    copies, capsys)
    assert str(copies / out) in line and "input" in line


def test_predict_refuses_to_write_into_its_dataset_or_model(
        copies: Path, capsys: pytest.CaptureFixture[str]) -> None:
    split_file = next((copies / "ds" / "test").glob("*.parquet"))
    line = _refused(["predict", "--model", str(copies / "export"), "--dataset",
                     str(copies / "ds"), "--out", str(split_file)], copies, capsys)
    assert "inside an input" in line and str(split_file) in line
    line = _refused(["predict", "--model", str(copies / "export"), "--dataset",
                     str(copies / "ds"), "--out", str(copies / "export" / "manifest.json")],
                    copies, capsys)
    assert "inside an input" in line


def test_outputs_beside_the_inputs_are_allowed(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    refuse_output_over_inputs(tmp_path / "run-export", [tmp_path / "run", None])
    refuse_output_over_inputs(tmp_path / "scores.parquet", [tmp_path / "run"])
    with pytest.raises(ConfigError, match="output folder contains an input"):
        refuse_output_over_inputs(tmp_path, [tmp_path / "run"])
