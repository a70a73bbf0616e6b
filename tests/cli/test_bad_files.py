"""Files that cannot be read and outputs that cannot be written: one line, exit 1, no trace.

Each case runs the real command and checks what a user sees and what is left on disk.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ctrctl.testing.datasets import make_dataset
from tests.cli.test_app import CTRCTL, error_lines, run

ROOT = Path(__file__).resolve().parents[2]
BINARY = bytes(range(256))[::-1] * 4


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bad-files")
    make_dataset(folder / "ds", rows=256, num_sparse=3, seed=0)
    (folder / "bin.yaml").write_bytes(BINARY)
    (folder / "bin.json").write_bytes(BINARY)
    (folder / "a-file").write_text("not a folder\n")
    bad = folder / "bad-manifest"
    bad.mkdir()
    (bad / "manifest.json").write_bytes(BINARY)
    pq.write_table(pa.table({"label": ["1", "0"], "score": [0.1, 0.2]}), folder / "strings.parquet")
    return folder


def _before(folder: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in folder.rglob("*")}


CASES = {
    "binary schema": (["preprocess", "--schema", "bin.yaml", "--input", "train=x.tsv",
                       "--out", "o"], "bin.yaml:1", "not UTF-8"),
    "binary config": (["train", "--dataset", "ds", "--out", "o", "-c", "bin.yaml"],
                      "bin.yaml:1", "not UTF-8"),
    "binary plan": (["train", "--dataset", "ds", "--out", "o", "--plan", "bin.json"],
                    "bin.json:1", "not UTF-8"),
    "binary topology": (["plan", "--dataset", "ds", "--topology", "bin.json"], "bin.json:1",
                        "not UTF-8"),
    "binary tables": (["plan", "--tables", "bin.yaml"], "bin.yaml:1", "not UTF-8"),
    "binary manifest": (["train", "--dataset", "bad-manifest", "--out", "o"],
                        "manifest.json:1", "not UTF-8"),
    "corrupt predictions": (["eval", "--predictions", "bin.json", "--out", "o"], "bin.json",
                            "not a readable Parquet file"),
    "string predictions": (["eval", "--predictions", "strings.parquet", "--out", "o"],
                           "strings.parquet", "holds string"),
    "train out is a file": (["train", "--dataset", "ds", "--out", "a-file"], "a-file",
                            "not a folder"),
    "out under a file": (["synth", "--rows", "100", "--out", "a-file/x"], "a-file", "not a folder"),
    "out unwritable (synth)": (["synth", "--rows", "100", "--out", "/proc/ctrctl-x"],
                               "/proc/ctrctl-x", "cannot write"),
    "out unwritable (eval)": (["eval", "--predictions", "strings.parquet", "--out",
                               "/proc/ctrctl-x"], "/proc/ctrctl-x", "cannot write"),
    "out unwritable (plan)": (["plan", "--dataset", "ds", "--out", "/proc/ctrctl.json"],
                              "/proc/ctrctl.json", "cannot write"),
    "plan out is a folder": (["plan", "--dataset", "ds", "--out", "ds"], "ds", "not a file"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_one_line_and_nothing_changed(work: Path, name: str) -> None:
    args, where, what = CASES[name]
    if "/proc" in " ".join(args) and not os.path.isdir("/proc"):
        pytest.skip("needs /proc as an unwritable folder")
    before = _before(work)
    done = run([CTRCTL, *args, "--no-track"], work)
    lines = error_lines(done.stderr)
    errors = [line for line in lines if line.startswith("error:")]
    assert done.returncode == 1, done.stderr
    assert len(errors) == 1 and where in errors[0] and what in errors[0], done.stderr
    assert "Traceback" not in done.stderr
    assert not (work / "o").exists()
    assert _before(work) == before


def test_paths_in_manifest_metadata_and_latest_stay_inside(tmp_path: Path) -> None:
    import json

    from ctrctl.checkpoint import latest_checkpoint
    from ctrctl.data.manifest import DatasetManifest
    from ctrctl.errors import CheckpointError, FormatError

    make_dataset(tmp_path / "ds", rows=64, num_sparse=2, seed=0)
    path = tmp_path / "ds" / "manifest.json"
    data = json.loads(path.read_text())
    for escape in ("../../etc/passwd", "/etc/passwd"):
        data["splits"]["train"]["files"] = [escape]
        path.write_text(json.dumps(data))
        with pytest.raises(FormatError, match="leaves its folder"):
            DatasetManifest.load(tmp_path / "ds")
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "latest").write_text("../../elsewhere\n")
    with pytest.raises(CheckpointError, match="leaves its folder"):
        latest_checkpoint(checkpoints)


def test_predict_and_quantize_check_their_outputs_first(work: Path) -> None:
    for args, where in ((["predict", "--model", "m", "--dataset", "ds", "--out",
                          "/proc/ctrctl.parquet"], "/proc/ctrctl.parquet"),
                        (["predict", "--model", "m", "--dataset", "ds", "--out", "ds"], "ds"),
                        (["quantize", "--checkpoint", "c", "--out", "a-file"], "a-file")):
        done = run([CTRCTL, *args], work)
        errors = [line for line in error_lines(done.stderr) if line.startswith("error:")]
        assert done.returncode == 1 and len(errors) == 1 and where in errors[0], done.stderr


@pytest.mark.parametrize("model,what", [
    ("nowhere", "no manifest: not a ctrctl serving artifact"),
    ("ds", "format 'ctrctl.dataset' is not 'ctrctl.export'"),
    ("bad-manifest", "not valid JSON"),
    ("a-file", "cannot read the manifest")])
def test_predict_names_a_folder_that_is_not_an_artifact(work: Path, model: str,
                                                        what: str) -> None:
    before = _before(work)
    done = run([CTRCTL, "predict", "--model", model, "--dataset", "ds", "--out", "o"], work)
    errors = [line for line in error_lines(done.stderr) if line.startswith("error:")]
    assert done.returncode == 1, done.stderr
    assert len(errors) == 1 and f"{model}/manifest.json" in errors[0] and what in errors[0], \
        done.stderr
    assert "Traceback" not in done.stderr
    assert not (work / "o").exists() and _before(work) == before
