"""Small real disks for fault tests: a tmpfs of a few kB that fills up, or one remounted
read-only (root ignores file modes, so a read-only folder would test nothing)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, check=False)


@contextmanager
def small_tmpfs(where: Path, size: str = "16k", read_only: bool = False) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` at ``where`` (created) for the block; skip where mount fails.

    Args:
        where: an empty folder to mount on.
        size: the tmpfs ``size=`` option ("16k", "1m").
        read_only: remount it read-only once mounted.
    """
    where.mkdir(parents=True, exist_ok=True)
    done = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where))
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root and mount(8) are needed): "
                    f"{done.stderr.strip()}")
    try:
        if read_only:
            remount_read_only(where)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def remount_read_only(where: Path) -> None:
    """Make the tmpfs mounted at ``where`` read-only (what is on it stays)."""
    done = _mount("-o", "remount,ro", str(where))
    assert done.returncode == 0, done.stderr


def leftovers(folder: Path) -> list[str]:
    """What is on ``folder`` (a mount), relative names."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
