"""Inputs preprocess must refuse: truncated or corrupt gzip files, outputs over inputs."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import pytest

from ctrctl.data.preprocess import preprocess
from ctrctl.data.readers import gzip_damage
from ctrctl.errors import ConfigError, InputDataError

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ctrctl.data.synthetic import synthesize

    folder = tmp_path_factory.mktemp("logs")
    synthesize(folder / "criteo", rows=6000, format="criteo", seed=1, splits={"train": 1.0})
    synthesize(folder / "avazu", rows=3000, format="avazu", seed=1, splits={"train": 1.0})
    return folder


def _cut(source: Path, out: Path, keep: float = 0.5) -> tuple[Path, int]:
    """gzip ``source`` and keep the first ``keep`` of its compressed bytes; returns the lines
    that decompress completely from what is kept."""
    packed = gzip.compress(source.read_bytes())
    out.write_bytes(packed[: int(len(packed) * keep)])
    import zlib

    partial = zlib.decompressobj(wbits=31).decompress(out.read_bytes())
    return out, partial.count(b"\n")


def _flip(source: Path, out: Path) -> Path:
    packed = bytearray(gzip.compress(source.read_bytes()))
    middle = len(packed) // 2
    packed[middle : middle + 8] = bytes(b ^ 0xFF for b in packed[middle : middle + 8])
    out.write_bytes(bytes(packed))
    return out


def test_damage_names_the_line(logs: Path, tmp_path: Path) -> None:
    cut, lines = _cut(logs / "criteo" / "train.tsv", tmp_path / "cut.tsv.gz")
    error = gzip_damage(cut)
    assert error is not None and "cut off" in error.message
    assert error.where == f"{cut}:{lines + 1}"
    whole = tmp_path / "whole.tsv.gz"
    whole.write_bytes(gzip.compress(b"a\nb\n") + gzip.compress(b"c\n"))  # two members
    assert gzip_damage(whole) is None
    assert "damaged" in gzip_damage(_flip(logs / "criteo" / "train.tsv",
                                          tmp_path / "f.tsv.gz")).message  # type: ignore[union-attr]


@pytest.mark.parametrize("engine", ["auto", "polars"])
@pytest.mark.parametrize("fmt", ["criteo", "avazu"])
@pytest.mark.parametrize("damage", ["cut", "flip"])
def test_preprocess_refuses_and_leaves_nothing(logs: Path, tmp_path: Path, engine: str,
                                               fmt: str, damage: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CTRCTL_PREPROCESS_ENGINE", engine)
    name = "train.tsv" if fmt == "criteo" else "train.csv"
    source = logs / fmt / name
    bad = tmp_path / f"{name}.gz"
    if damage == "cut":
        _cut(source, bad)
    else:
        _flip(source, bad)
    out = tmp_path / "ds"
    with pytest.raises(InputDataError, match="gzip input") as info:
        preprocess(SCHEMAS / f"{fmt}.yaml", [f"train={bad}"], out)
    assert str(bad) in info.value.render()
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [bad.name]


def test_cli_prints_one_line(logs: Path, tmp_path: Path) -> None:
    cut, lines = _cut(logs / "criteo" / "train.tsv", tmp_path / "day_0.gz")
    proc = subprocess.run(
        [sys.executable, "-m", "ctrctl", "preprocess", "--schema", str(SCHEMAS / "criteo.yaml"),
         "--input", f"train={cut}", "--out", str(tmp_path / "ds"), "--no-track"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"day_0.gz:{lines + 1}" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr and "Aborted" not in proc.stderr
    assert not (tmp_path / "ds").exists()


@pytest.mark.parametrize("overwrite", [False, True])
def test_an_output_over_its_inputs_is_refused(logs: Path, tmp_path: Path,
                                              overwrite: bool) -> None:
    folder = tmp_path / "raw"
    folder.mkdir()
    source = folder / "train.tsv"
    source.write_bytes((logs / "criteo" / "train.tsv").read_bytes()[:100_000].rsplit(b"\n", 1)[0]
                       + b"\n")
    before = source.read_bytes()
    for out in (folder, tmp_path):
        with pytest.raises(ConfigError, match="output folder contains an input"):
            preprocess(SCHEMAS / "criteo.yaml", [f"train={source}"], out, overwrite=overwrite)
    assert source.read_bytes() == before
