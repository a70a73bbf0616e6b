"""``ctrctl run`` with its workdir on a read-only disk: one line naming the workdir (it was an
OSError traceback from the lock file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ctrctl.cli.app import main
from ctrctl.errors import OutputLocationError
from ctrctl.io import output_lock
from tests.disks import remount_read_only, small_tmpfs

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("existing", [False, True])
def test_a_read_only_workdir_is_one_line(existing: bool, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    disk = tmp_path / "disk"
    with small_tmpfs(disk, "64k"):
        if existing:
            (disk / "wd").mkdir()
        remount_read_only(disk)
        code = main(["run", str(ROOT / "pipelines" / "demo.yaml"), "--workdir",
                     str(disk / "wd"), "--plain", "--no-track"])
    assert code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(disk / "wd") in lines[0] and "Read-only file system" in lines[0]


def test_the_lock_of_an_output_on_a_read_only_disk(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", "64k") as disk:
        (disk / "out").mkdir()
        remount_read_only(disk)
        with pytest.raises(OutputLocationError, match="lock file") as caught:
            with output_lock(disk / "out", "test"):
                pass
    assert caught.value.where == str(tmp_path / "disk" / "out")
