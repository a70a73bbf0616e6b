"""``quantize`` of a run whose training dataset is gone refuses, naming it and ``--dataset``.

It wrote an artifact without vocabularies, with rc 0, that every later ``predict`` and
``serving.load`` failed on.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ctrctl.cli.app import main
from ctrctl.testing.threads import torch_threads
from tests import vocab_run
from tests.vocab_run import Pipeline

pipeline = vocab_run.pipeline  # the shared small pipeline (a session fixture)


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_deleted_training_dataset_is_named(pipeline: Pipeline, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    dataset = tmp_path / "ds_tmp"
    shutil.copytree(pipeline.dataset, dataset)
    with torch_threads(1):
        assert main(["train", "--dataset", str(dataset), "--out", str(tmp_path / "run"),
                     "-c", str(vocab_run.ROOT / "pipelines" / "small.yaml"),
                     "training.epochs=1", "training.batch_size=256", "--no-track"]) == 0
        shutil.rmtree(dataset)
        assert main(["quantize", "--checkpoint", str(tmp_path / "run"), "--out",
                     str(tmp_path / "export"), "--no-track"]) == 1
        line = _error(capsys)
        assert str(dataset) in line and "--dataset" in line and "C1" in line
        assert not (tmp_path / "export").exists()

        (tmp_path / "no-vocab").mkdir()  # a folder without the vocabularies: refused too
        assert main(["quantize", "--checkpoint", str(tmp_path / "run"), "--dataset",
                     str(tmp_path / "no-vocab"), "--out", str(tmp_path / "export"),
                     "--no-track"]) == 1
        assert "vocabularies of C1" in _error(capsys)
        assert main(["quantize", "--checkpoint", str(tmp_path / "run"), "--dataset",
                     str(pipeline.dataset), "--out", str(tmp_path / "export"),
                     "--no-track"]) == 0  # the way out the message names
    assert (tmp_path / "export" / "vocab" / "C1.json").is_file()
