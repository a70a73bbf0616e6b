"""``ctrctl quantize`` and ``ctrctl predict`` end to end, as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from ctrctl.cli.app import main
from tests.inference.conftest import Trained, trained  # noqa: F401  (the shared checkpoint)

CTRCTL = str(Path(sys.executable).parent / "ctrctl")


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["COLUMNS"] = "200"
    return subprocess.run([CTRCTL, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def test_quantize_and_predict_in_process(trained: Trained, tmp_path: Path,  # noqa: F811
                                        capsys: pytest.CaptureFixture[str]) -> None:
    export = tmp_path / "export"
    code = main(["quantize", "--checkpoint", str(trained.run), "--dtype", "int4",
                 "--per-table", "C1=fp16", "--shards", "2", "--out", str(export), "--no-track"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "C1" in err and "fp16" in err and "serving placement" in err
    assert "inference cost mode" in err and "slowest shard" in err and "fullest shard" in err
    assert main(["quantize", "--checkpoint", str(trained.run), "--out", str(tmp_path / "x"),
                 "--device-memory-gb", "0.000001", "--no-track"]) == 1
    assert "fits on no shard" in capsys.readouterr().err and not (tmp_path / "x").exists()
    scores = tmp_path / "scores.parquet"
    assert main(["predict", "--model", str(export), "--dataset", str(trained.dataset.path),
                 "--out", str(scores), "--no-track"]) == 0
    assert "rows/s" in capsys.readouterr().err
    assert pq.read_table(scores).column_names == ["label", "score"]
    fast = tmp_path / "compiled.parquet"
    assert main(["predict", "--model", str(export), "--dataset", str(trained.dataset.path),
                 "--compile", "--out", str(fast), "--no-track"]) == 0
    assert "could not be compiled" not in capsys.readouterr().err
    np.testing.assert_allclose(pq.read_table(fast).column("score").to_numpy(),
                               pq.read_table(scores).column("score").to_numpy(), rtol=1.3e-6)
    assert main(["predict", "--model", str(export), "--out", str(scores), "--no-track"]) == 1
    assert "one of --dataset and --input" in capsys.readouterr().err


@pytest.mark.slow
def test_quantize_predict_eval(trained: Trained, tmp_path: Path) -> None:  # noqa: F811
    export = tmp_path / "export"
    done = _run(["quantize", "--checkpoint", str(trained.run), "--dtype", "int8",
                 "--per-table", "C5=int4", "--shards", "2", "--device-memory-gb", "0.001",
                 "--out", str(export), "--no-track"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "C5" in done.stderr and "int4" in done.stderr and "serving placement" in done.stderr
    manifest = json.loads((export / "manifest.json").read_text())
    assert manifest["quantization"]["num_shards"] == 2

    again = _run(["quantize", "--checkpoint", str(trained.run), "--out", str(export),
                  "--no-track"], tmp_path)
    assert again.returncode == 1 and "--overwrite" in again.stderr

    too_small = _run(["quantize", "--checkpoint", str(trained.run), "--out",
                      str(tmp_path / "x"), "--device-memory-gb", "0.000001", "--no-track"],
                     tmp_path)
    assert too_small.returncode == 1 and "fits on no shard" in too_small.stderr
    assert not (tmp_path / "x").exists()

    scores = tmp_path / "scores.parquet"
    done = _run(["predict", "--model", str(export), "--dataset", str(trained.dataset.path),
                 "--split", "test", "--out", str(scores), "--no-track"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows/s" in done.stderr
    assert pq.read_table(scores).num_rows == 600

    done = _run(["eval", "--predictions", str(scores), "--out", str(tmp_path / "eval"),
                 "--no-track"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("has_bf16", [False, True])
def test_bf16_dense_layers_on_a_cpu_without_bf16_say_so(
        trained: Trained, tmp_path: Path, capsys: pytest.CaptureFixture[str],  # noqa: F811
        monkeypatch: pytest.MonkeyPatch, has_bf16: bool) -> None:
    """Exporting bf16 dense layers where they would be emulated works, with a note naming
    the missing instructions and the fp32 alternative; where the CPU has them, no note."""
    import ctrctl.compat

    monkeypatch.setattr(ctrctl.compat, "bf16_autocast_supported", lambda device="cpu": has_bf16)
    export = tmp_path / "export"
    assert main(["quantize", "--checkpoint", str(trained.run), "--dense-dtype", "bf16",
                 "--out", str(export), "--no-track"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert (export / "manifest.json").exists()
    assert ("no AMX-BF16 or AVX512-BF16" in err and "--dense-dtype fp32" in err) != has_bf16
