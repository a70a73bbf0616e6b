"""Publishing outputs: staged folders, atomic files, and the temp names they share.

Every output of ctrctl (a dataset, synthetic logs, an evaluation folder, a checkpoint, a JSON
file) is written under a temporary name beside its final path and renamed into place once
complete, so nothing at the final path is ever partial. One temp-name scheme serves them all::

    .<name>.tmp-<host>-<pid>-<random>      e.g.  .dataset.tmp-node3-41234-9f2c01ab

The host and pid say which process owns it: when a later command stages anything into the
same parent folder, the temp entries of processes that no longer run on this host are
removed (:func:`remove_stale_temps`), so a killed run leaves nothing behind for long.

Example:
    >>> with staged_folder(Path("eval-out"), overwrite=False) as staging:
    ...     write_json_atomic(staging / "metrics.json", {"auc": 0.8})
    >>> read_json_file(Path("eval-out/metrics.json"))
    {'auc': 0.8}
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ctrctl.errors import CtrctlError, FormatError, OutputExistsError

__all__ = [
    "TEMP_MARK",
    "check_destination",
    "publish_staged",
    "read_json_file",
    "remove_stale_temps",
    "stage_folder",
    "staged_folder",
    "temp_path",
    "write_json_atomic",
    "write_text_atomic",
]

logger = logging.getLogger(__name__)

#: What separates the final name from the owner in a temp name.
TEMP_MARK = ".tmp-"
_TEMP_RE = re.compile(r"^\.(?P<name>.+)\.tmp-(?P<host>[A-Za-z0-9]*)-(?P<pid>\d+)-[0-9a-f]{8}$")


def _host() -> str:
    """This host's name reduced to letters and digits (a temp name must parse back)."""
    return re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:24]


def temp_path(final: str | Path, pid: int | None = None) -> Path:
    """A fresh temp name for ``final`` in its parent folder, owned by ``pid`` (default: this
    process). Nothing is created."""
    final = Path(final)
    owner = os.getpid() if pid is None else pid
    return final.parent / f".{final.name}{TEMP_MARK}{_host()}-{owner}-{secrets.token_hex(4)}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_stale_temps(parent: str | Path) -> list[Path]:
    """Remove the temp folders and files in ``parent`` left by processes that were killed.

    Only entries named by :func:`temp_path` whose host is this host and whose process is no
    longer running are removed: a live run's staging folder, and one made on another host of a
    shared file system, are left alone.

    Returns:
        The paths removed.
    """
    parent = Path(parent)
    removed: list[Path] = []
    if not parent.is_dir():
        return removed
    host = _host()
    for path in parent.iterdir():
        match = _TEMP_RE.match(path.name)
        if match is None or match["host"] != host or _pid_alive(int(match["pid"])):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        logger.info("removed %s, left by an interrupted run", path)
        removed.append(path)
    return removed


def check_destination(final: str | Path, overwrite: bool) -> None:
    """Refuse an existing ``final`` unless ``overwrite``, and a file in any case.

    Raises:
        OutputExistsError: naming ``final`` and what to do.
    """
    final = Path(final)
    if final.exists() and not final.is_dir():
        raise OutputExistsError("the output path is a file, not a folder", where=str(final),
                                hint="choose another --out")
    if final.exists() and not overwrite:
        raise OutputExistsError(
            "output folder already exists",
            where=str(final),
            hint="pass --overwrite to replace it, or choose another --out",
        )


def stage_folder(final: str | Path, *, overwrite: bool = False) -> Path:
    """Create an empty staging folder beside ``final`` and return it.

    Refuses an existing ``final`` unless ``overwrite`` (an existing file is always refused),
    and first removes stale temp entries in the parent (:func:`remove_stale_temps`). Pair it
    with :func:`publish_staged`, or use :func:`staged_folder`, which does both.

    Raises:
        OutputExistsError: ``final`` exists and ``overwrite`` is false, or it is a file.
    """
    final = Path(final)
    check_destination(final, overwrite)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(final.parent)
    staging = temp_path(final)
    staging.mkdir()
    return staging


def publish_staged(staging: str | Path, final: str | Path) -> None:
    """Rename a complete ``staging`` folder to ``final``.

    An existing ``final`` is moved aside under a temp name first and removed only once the new
    folder is in place, so ``final`` is at every moment either the old folder or the new one
    (or, for the instant between the two renames, absent; never partial).
    """
    staging, final = Path(staging), Path(final)
    old = None
    if final.exists():
        old = temp_path(final)
        os.replace(final, old)
    os.replace(staging, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def staged_folder(final: str | Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Write a folder under a temp name, then rename it to ``final``; a failure removes it.

    Args:
        final: the folder to create.
        overwrite: replace an existing ``final`` (only once the new one is complete).

    Yields:
        The empty staging folder to write into.

    Raises:
        OutputExistsError: ``final`` exists and ``overwrite`` is false (before anything is
            written), or ``final`` is a file.

    Example:
        >>> with staged_folder(Path("logs")) as tmp:
        ...     (tmp / "train.tsv").write_bytes(data)
    """
    final = Path(final)
    staging = stage_folder(final, overwrite=overwrite)
    try:
        yield staging
        publish_staged(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file and a rename: never half-written.

    The parent folder is created when missing; the file gets the usual mode (0666 less the
    umask).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON to ``path`` atomically (see
    :func:`write_text_atomic`); values JSON does not know are written as ``str``."""
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json_file(path: str | Path, missing: CtrctlError | None = None) -> Any:
    """Parse a JSON file.

    Args:
        path: the file.
        missing: raised when the file does not exist (default: a FormatError naming it).

    Raises:
        FormatError: the file is not valid JSON; the message gives the line and column.
    """
    path = Path(path)
    if not path.is_file():
        raise missing or FormatError("file not found", where=str(path))
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise FormatError(f"invalid JSON: {exc}", where=str(path)) from exc
    except UnicodeDecodeError as exc:
        raise FormatError(f"not a text file: {exc}", where=str(path)) from exc
