"""A full disk under a command's output is one line naming the output, and nothing partial.

Train's checkpoint write, eval --save-predictions and quantize gave tracebacks; preprocess and
predict gave one line that blamed the input file. Each case writes to a real tmpfs of a few
kB (skipped where mount is not allowed).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ctrctl import checkpoint as ckpt
from ctrctl.cli.app import main
from ctrctl.config import load_config
from ctrctl.errors import OutputLocationError
from ctrctl.testing.threads import torch_threads
from ctrctl.training.loop import train
from tests import vocab_run
from tests.disks import leftovers, small_tmpfs
from tests.inference.conftest import OVERRIDES
from tests.vocab_run import Pipeline

ROOT = Path(__file__).resolve().parents[1]
pipeline = vocab_run.pipeline  # the shared small pipeline (a session fixture)


def _one_line_naming(out: Path, err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"{out}: cannot write the output: no space left on device" in lines[0], lines[0]
    return lines[0]


def _fails_on_full_disk(args: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    with torch_threads(1):
        code = main([*args, "--out", str(out)])
    assert code == 1
    line = _one_line_naming(out, capsys.readouterr().err)
    assert leftovers(out.parent) == [], "a partial output or a temp file was left"
    return line


def test_preprocess_names_the_output(pipeline: Pipeline, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with small_tmpfs(tmp_path / "disk", "16k") as disk:
        line = _fails_on_full_disk(
            ["preprocess", "--schema", str(ROOT / "schemas" / "criteo_vocab.yaml"),
             "--input", f"train={pipeline.logs / 'train.tsv'}", "--no-track"],
            disk / "ds", capsys)
    assert "train.tsv" not in line  # the input is not to blame


def test_quantize(pipeline: Pipeline, tmp_path: Path,
                  capsys: pytest.CaptureFixture[str]) -> None:
    with small_tmpfs(tmp_path / "disk", "16k") as disk:
        _fails_on_full_disk(["quantize", "--checkpoint", str(pipeline.run), "--no-track"],
                            disk / "export", capsys)


def test_eval_save_predictions(pipeline: Pipeline, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    with small_tmpfs(tmp_path / "disk", "8k") as disk:
        _fails_on_full_disk(["eval", "--checkpoint", str(pipeline.run), "--save-predictions",
                             "--no-baselines", "--no-track"], disk / "eval", capsys)


@pytest.mark.parametrize("source", ["--dataset", "--input"])
def test_predict(source: str, pipeline: Pipeline, tmp_path: Path,
                 capsys: pytest.CaptureFixture[str]) -> None:
    given = str(pipeline.dataset) if source == "--dataset" else str(pipeline.logs / "test.tsv")
    with small_tmpfs(tmp_path / "disk", "4k") as disk:
        line = _fails_on_full_disk(["predict", "--model", str(pipeline.export), source, given],
                                   disk / "scores.parquet", capsys)
    assert "test.tsv" not in line


def test_train_keeps_the_previous_checkpoint(pipeline: Pipeline, tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", "4m") as disk:
        run = disk / "run"
        shutil.copytree(pipeline.run, run)
        before = ckpt.latest_checkpoint(run / "checkpoints")
        assert before is not None
        filler = disk / "filler"  # leaves less room than one more checkpoint takes
        free = shutil.disk_usage(disk).free
        filler.write_bytes(b"\0" * max(free - 16 * 1024, 0))
        with torch_threads(1), pytest.raises(OutputLocationError) as caught:
            train(pipeline.dataset, run, load_config(None, [*OVERRIDES, "training.epochs=1"]),
                  resume=True)
        assert caught.value.where == str(run)
        assert "no space left on device" in caught.value.message
        assert "checkpoints written before are kept" in caught.value.message
        assert ckpt.latest_checkpoint(run / "checkpoints") == before
        assert ckpt.read_metadata(before).step == 10
        assert not [p for p in run.rglob("*") if ".tmp-" in p.name]
