"""Staged folders and atomic files: nothing partial at a final path, no temp left behind."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ctrctl.errors import DatasetError, FormatError, OutputExistsError
from ctrctl.io import (
    file_sha256,
    json_sha256,
    read_json_file,
    remove_stale_temps,
    stage_folder,
    staged_folder,
    temp_path,
    tree_files,
    tree_sha256,
    write_json_atomic,
)


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_staged_folder_appears_whole_and_leaves_no_temp(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with staged_folder(out) as staging:
        assert staging.parent == tmp_path and staging.name.startswith(".out.tmp-")
        (staging / "a.txt").write_text("a")
        assert not out.exists()  # nothing at the final path until the block ends
    assert names(out) == ["a.txt"]
    assert names(tmp_path) == ["out"]


def test_a_failure_mid_way_leaves_nothing(tmp_path: Path) -> None:
    out = tmp_path / "nested" / "out"
    with pytest.raises(RuntimeError, match="disk full"):
        with staged_folder(out) as staging:
            (staging / "part").write_text("half")
            raise RuntimeError("disk full")
    assert not out.exists()
    assert names(out.parent) == []


def test_a_failed_overwrite_keeps_the_old_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with staged_folder(out, overwrite=True) as staging:
            (staging / "new.txt").write_text("new")
            raise KeyboardInterrupt
    assert names(out) == ["old.txt"]
    assert names(tmp_path) == ["out"]


def test_an_existing_output_is_refused_unless_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(OutputExistsError, match="already exists") as info:
        with staged_folder(out):
            raise AssertionError("the body must not run")
    assert "--overwrite" in info.value.render() and str(out) in info.value.render()
    assert names(out) == ["keep"] and names(tmp_path) == ["out"]
    with staged_folder(out, overwrite=True) as staging:
        (staging / "new").write_text("y")
    assert names(out) == ["new"] and names(tmp_path) == ["out"]
    (tmp_path / "file").write_text("z")
    with pytest.raises(OutputExistsError, match="a file"):
        stage_folder(tmp_path / "file", overwrite=True)


def _killed_run(parent: Path, name: str) -> Path:
    """Stage a folder (and a half-written file) in a process that is then killed."""
    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from ctrctl.io import stage_folder, temp_path\n"
        "staging = stage_folder(Path(sys.argv[1]) / sys.argv[2])\n"
        "(staging / 'part').write_text('half')\n"
        "temp_path(Path(sys.argv[1]) / 'metrics.json').write_text('{')\n"
        "print(staging, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(parent), name],
                          capture_output=True, text=True, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr
    return Path(done.stdout.strip())


def test_stale_temps_of_a_killed_run_are_removed_by_the_next_staging(tmp_path: Path) -> None:
    stale = _killed_run(tmp_path, "dataset")
    assert stale.is_dir() and len(names(tmp_path)) == 2  # its folder and its temp file
    live = stage_folder(tmp_path / "other")  # this process is alive: its folder stays
    foreign = tmp_path / ".x.tmp-otherhost-1-0123abcd"  # another host's: cannot tell, kept
    foreign.mkdir()
    unrelated = tmp_path / ".x.tmp-notours"
    unrelated.mkdir()
    # Staging into the same parent (any name) cleans what the killed run left.
    with staged_folder(tmp_path / "dataset") as staging:
        (staging / "ok").write_text("ok")
    assert not stale.exists()
    assert names(tmp_path) == sorted([live.name, foreign.name, unrelated.name, "dataset"])
    assert remove_stale_temps(tmp_path) == []


def test_remove_stale_temps_names_what_it_removed(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)
    folder = temp_path(tmp_path / "run", pid=pid)
    folder.mkdir()
    file = temp_path(tmp_path / "plan.json", pid=pid)
    file.write_text("{")
    mine = temp_path(tmp_path / "run")
    mine.mkdir()
    assert sorted(remove_stale_temps(tmp_path)) == sorted([folder, file])
    assert names(tmp_path) == [mine.name]
    assert remove_stale_temps(tmp_path / "missing") == []


def test_write_json_atomic_replaces_whole_or_not_at_all(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "a.json"
    write_json_atomic(path, {"b": 1, "a": [1.5, "x"]})
    assert json.loads(path.read_text()) == {"a": [1.5, "x"], "b": 1}
    assert path.read_text().endswith("\n")
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("cannot render")

    with pytest.raises(RuntimeError, match="cannot render"):
        write_json_atomic(path, {"bad": Unprintable()})
    assert json.loads(path.read_text()) == {"a": [1.5, "x"], "b": 1}
    assert names(path.parent) == ["a.json"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_read_json_file_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    with pytest.raises(FormatError, match="file not found") as info:
        read_json_file(path)
    assert str(path) in info.value.render()
    with pytest.raises(DatasetError, match="no manifest"):
        read_json_file(path, DatasetError("no manifest.json"))
    path.write_text('{\n  "a": 1,\n  "b": \n}\n')
    with pytest.raises(FormatError, match="invalid JSON.*line 4") as info:
        read_json_file(path)
    assert str(path) in info.value.render()
    path.write_text('{"a": [1, 2]}')
    assert read_json_file(path) == {"a": [1, 2]}


# ---- content hashes ----------------------------------------------------------------------
def test_the_standalone_loader_hashes_files_as_io_does(tmp_path: Path) -> None:
    """The artifact's loader keeps its own copy of the file hash (it runs without ctrctl)."""
    from ctrctl.inference import standalone

    sizes = [0, 1, (1 << 20) - 1, 1 << 20, (1 << 20) + 7]  # around the loader's read size
    for size in sizes:
        path = tmp_path / f"f{size}"
        path.write_bytes(os.urandom(size))
        assert standalone.sha256_file(str(path)) == file_sha256(path)
    assert file_sha256(tmp_path / "f0") == hashlib.sha256(b"").hexdigest()


def test_tree_sha256_counts_names_sizes_and_bytes(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    (folder / "tables").mkdir(parents=True)
    (folder / "a.bin").write_bytes(b"abc")
    (folder / "tables" / "b.bin").write_bytes(b"xyz")
    expected = hashlib.sha256()
    for rel, data in (("a.bin", b"abc"), ("tables/b.bin", b"xyz")):
        expected.update(f"{rel}\0{len(data)}\0{hashlib.sha256(data).hexdigest()}\n".encode())
    before = tree_sha256(folder)
    assert before == expected.hexdigest()
    # Locks and staging entries are not content.
    (folder / ".out.lock").write_text("{}")
    (folder / ".tmp-x").mkdir()
    (folder / ".tmp-x" / "c").write_text("c")
    assert tree_sha256(folder) == before
    assert tree_files(folder) == [folder / "a.bin", folder / "tables" / "b.bin"]
    # A rename changes it, so does one byte.
    (folder / "tables" / "b.bin").rename(folder / "tables" / "c.bin")
    renamed = tree_sha256(folder)
    assert renamed != before
    (folder / "a.bin").write_bytes(b"abd")
    assert tree_sha256(folder) not in (before, renamed)
    # A file hashes with its name; a cache's lookup is used when given.
    seen: list[Path] = []

    def lookup(path: Path) -> str:
        seen.append(path)
        return file_sha256(path)

    assert tree_sha256(folder / "a.bin", file_hash=lookup) == tree_sha256(folder / "a.bin")
    assert seen == [folder / "a.bin"]


def test_json_sha256_ignores_key_order() -> None:
    assert json_sha256({"a": 1, "b": [1, 2]}) == json_sha256({"b": [1, 2], "a": 1})
    assert json_sha256({"a": 1}) != json_sha256({"a": 2})
    assert json_sha256({"p": Path("x")}) == json_sha256({"p": "x"})
