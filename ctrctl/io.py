"""Files in and out: reading a user's text files, where outputs may go, and who writes them.

Every file a user names (schema, config, plan, topology, tables, manifest) is read through
:func:`read_text`, so a missing, unreadable or binary file is one clear error naming it;
every output folder a command takes is checked by :func:`check_output_location` before any
work starts, and held with :func:`output_lock` while the command writes it.

Example:
    >>> text = read_text("schemas/criteo.yaml", SchemaError, what="schema")
    >>> check_output_location(Path("runs/r1"))
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from ctrctl.errors import CtrctlError, OutputLocationError, OutputLockedError

logger = logging.getLogger(__name__)


def read_text(path: str | Path, error: type[CtrctlError] = CtrctlError,
              what: str = "file", hint: str | None = None) -> str:
    """The UTF-8 text of ``path``, or ``error`` naming the file and what is wrong with it.

    Args:
        path: the file.
        error: the CtrctlError subclass to raise (SchemaError for a schema, ...).
        what: what the file is, for the message ("schema", "config file", ...).
        hint: what to do when the file is missing.
    """
    path = Path(path)
    where = str(path)
    if not path.exists():
        raise error(f"{what} not found", where=where, hint=hint)
    if not path.is_file():
        raise error(f"{what} is not a regular file", where=where)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read the {what} ({exc.strerror})", where=where) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise error(f"the {what} is not UTF-8 text (byte {exc.start:,} in line {line}: "
                    f"a binary or damaged file?)", where=f"{where}:{line}") from None


def inside(name: str, error: type[CtrctlError], where: str) -> str:
    """``name``, a path read from a file, if it stays inside that file's folder.

    Manifests, checkpoint metadata and ``latest`` name files relative to their folder; an
    absolute name or one with ``..`` would read (or, replaced, delete) files elsewhere.
    """
    parts = Path(name).parts
    if not name or Path(name).is_absolute() or ".." in parts:
        raise error(f"the path {name!r} leaves its folder", where=where,
                    hint="paths in this file must be relative and stay inside its folder")
    return name


def check_output_location(out: str | Path, folder: bool = True) -> Path:
    """Refuse, before any work, an output that cannot be written.

    ``out`` may exist (the command decides about overwriting) or not; its nearest existing
    ancestor must be a writable folder (missing parents are created later).

    Args:
        out: the output path.
        folder: the output is a folder (False: a file).

    Raises:
        OutputLocationError: ``out`` is of the other kind, or sits under a file or an
            unwritable folder.
    """
    out = Path(out)
    if out.exists() and out.is_dir() != folder:
        kind = "a folder" if folder else "a file"
        raise OutputLocationError(f"the output exists and is not {kind}", where=str(out),
                                  hint=f"pass the path of {kind} to --out")
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OutputLocationError(f"{parent} is not a folder", where=str(out))
    try:  # a real write: permission bits do not tell root, or a read-only mount, apart
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as exc:
        raise OutputLocationError(f"cannot write in {parent} ({exc.strerror})",
                                  where=str(out), hint="choose another --out") from None
    return out


@dataclass(frozen=True)
class LockHolder:
    """Who holds an output lock: written into the lock file by its holder."""

    host: str
    pid: int
    command: str
    since: float

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return f"pid {self.pid} on {self.host} ({self.command!r}, since {when})"


def lock_path(out: str | Path, name: str = "") -> Path:
    """The lock file of output ``out``: hidden, beside it (the output itself may not exist
    yet, and is renamed into place at the end)."""
    out = Path(out)
    suffix = f".{name}" if name else ""
    return out.absolute().parent / f".{out.name}{suffix}.lock"


def _read_holder(path: Path) -> LockHolder | None:
    try:
        data = json.loads(path.read_text())
        return LockHolder(str(data["host"]), int(data["pid"]), str(data["command"]),
                          float(data["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


@contextlib.contextmanager
def output_lock(out: str | Path, command: str, name: str = "") -> Iterator[Path]:
    """Hold the advisory lock of output ``out`` while a command writes it.

    A second command on the same output fails at once, naming the holder. The lock is an
    ``flock`` on a file beside the output, so it dies with its process: a lock file left by
    a killed run is stale, reported and taken over. Several nodes that share one output
    pass distinct ``name`` s (one writer per file, as their files are distinct too).

    Raises:
        OutputLockedError: another live process holds the lock.
    """
    path = lock_path(out, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(path)
            raise OutputLockedError(
                f"the output is being written by {holder.describe() if holder else 'another process'}",
                where=str(out), hint="wait for it, or choose another --out") from None
        stale = _read_holder(path)
        if stale is not None:
            logger.warning("%s: taking over a stale lock of %s", out, stale.describe())
        me = LockHolder(socket.gethostname(), os.getpid(), command, time.time())
        os.ftruncate(handle, 0)
        os.pwrite(handle, json.dumps(asdict(me)).encode(), 0)
        os.fsync(handle)
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)  # still held: nobody else can be mid-acquire on it
    finally:
        os.close(handle)
