"""Files in and out: staged folders, atomic files, user files read, output checks and locks.

Every output of ctrctl (a dataset, synthetic logs, an evaluation folder, a checkpoint, a JSON
file) is written under a temporary name beside its final path and renamed into place once
complete, so nothing at the final path is ever partial. One temp-name scheme serves them all::

    .<name>.tmp-<host>-<pid>-<random>      e.g.  .dataset.tmp-node3-41234-9f2c01ab

The host and pid say which process owns it: when a later command stages anything into the
same parent folder, the temp entries of processes that no longer run on this host are
removed (:func:`remove_stale_temps`), so a killed run leaves nothing behind for long.

Every file a user names (schema, config, plan, topology, tables, manifest) is read through
:func:`read_text`, so a missing, unreadable or binary file is one clear error naming it; every
output a command takes is checked by :func:`check_output_location` before any work starts and
held with :func:`output_lock` (an ``flock`` beside it) while the command writes it.

Content hashes are made here too, one way each: a file's bytes (:func:`file_sha256`), a
folder's files (:func:`tree_sha256`: each file's relative path, size and sha256, in path
order) and settings or metadata as canonical JSON (:func:`json_sha256`).

Example:
    >>> with staged_folder(Path("eval-out"), overwrite=False) as staging:
    ...     write_json_atomic(staging / "metrics.json", {"auc": 0.8})
    >>> read_json_file(Path("eval-out/metrics.json"))
    {'auc': 0.8}
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ctrctl.errors import (
    ConfigError,
    CtrctlError,
    DiskRefusedError,
    FormatError,
    OutputExistsError,
    OutputLocationError,
    OutputLockedError,
)

__all__ = [
    "TEMP_MARK",
    "LockHolder",
    "check_destination",
    "check_output_location",
    "file_sha256",
    "inside",
    "json_sha256",
    "lock_path",
    "output_lock",
    "path_name_problem",
    "read_text",
    "publish_staged",
    "refuse_output_over_inputs",
    "read_json_file",
    "remove_stale_temps",
    "stage_folder",
    "staged_folder",
    "temp_path",
    "tree_files",
    "tree_sha256",
    "write_json_atomic",
    "write_failure",
    "write_text_atomic",
    "writing",
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


# ---- content hashes ----------------------------------------------------------------------
#: Files a folder's hash never counts: lock files (held beside outputs, not content).
_UNHASHED_SUFFIXES = (".lock",)


def file_sha256(path: str | Path) -> str:
    """The hex sha256 of a file's bytes, as stored (a ``.gz`` hashes as its compressed
    bytes). The artifact's standalone loader keeps its own copy of this function (it runs
    without ctrctl); ``tests/test_io.py`` checks that the two agree."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def tree_files(path: str | Path) -> list[Path]:
    """The files :func:`tree_sha256` counts under ``path`` (``path`` itself for a file), in
    path order: every regular file but lock files and anything under a ``.tmp*`` name."""
    path = Path(path)
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file()
                  and not p.name.endswith(_UNHASHED_SUFFIXES)
                  and not any(part.startswith(".tmp") for part in p.relative_to(path).parts))


def tree_sha256(path: str | Path, files: Iterable[Path] | None = None,
                file_hash: Callable[[Path], str] = file_sha256) -> str:
    """The hex sha256 of a folder (or one file): each file's path relative to the folder,
    its size and its sha256, one line each, in path order, so a rename, a new file or one
    changed byte changes it. What anyone can recompute from the files alone.

    Args:
        path: a folder, or a file (then hashed with its name, relative to its parent).
        files: the files to count (default: :func:`tree_files`), e.g. one split's.
        file_hash: how to hash one file (a cache's lookup; default :func:`file_sha256`).

    Example:
        >>> tree_sha256(Path("runs/a/checkpoint"))  # doctest: +SKIP
        '3f1c...'
    """
    path = Path(path)
    digest = hashlib.sha256()
    base = path if path.is_dir() else path.parent
    for item in sorted(files) if files is not None else tree_files(path):
        rel = item.relative_to(base).as_posix()
        digest.update(f"{rel}\0{item.stat().st_size}\0{file_hash(item)}\n".encode())
    return digest.hexdigest()


def json_sha256(data: Any) -> str:
    """The hex sha256 of ``data`` as canonical JSON (sorted keys; values JSON does not know
    as ``str``): the same settings or metadata hash the same whatever their order."""
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


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
    if not path.exists():
        raise missing or FormatError("file not found", where=str(path))
    text = read_text(path, FormatError, "JSON file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"invalid JSON: {exc}", where=str(path)) from exc


# ---- reading what users name, and where outputs may go ----------------------------------
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


#: The most UTF-8 bytes of a name that becomes a file or folder name (a feature, table,
#: split or model): 255 (a file name's limit) less room for what ctrctl adds to it
#: (``_hour`` of a derived feature, ``.safetensors``, ``.parquet``, a temporary suffix).
MAX_NAME_BYTES = 200


def path_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be one component of a path (None when it can).

    Any text is a name (``Ç1_点击``) but an empty one, ``.`` and ``..``, one holding ``/``,
    a backslash, a NUL or another control character, and one over :data:`MAX_NAME_BYTES`
    bytes.

    Example:
        >>> path_name_problem("C1") is None, path_name_problem("../evil")
        (True, "contains '/' (it becomes a file name and must stay in its folder)")
    """
    if not isinstance(name, str) or not name:
        return "is empty or not text"
    if name in (".", ".."):
        return "is '.' or '..' (it becomes a file name and must stay in its folder)"
    for bad in ("/", "\\"):
        if bad in name:
            return f"contains {bad!r} (it becomes a file name and must stay in its folder)"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in name):
        return "contains a control character"
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        return (f"is {size:,} bytes long (at most {MAX_NAME_BYTES}: it becomes a file name, "
                "and file names stop at 255 bytes)")
    return None


def check_output_location(out: str | Path, folder: bool = True, option: str = "--out") -> Path:
    """Refuse, before any work, an output that cannot be written.

    ``out`` may exist (the command decides about overwriting) or not; its nearest existing
    ancestor must be a writable folder (missing parents are created later).

    Args:
        out: the output path.
        folder: the output is a folder (False: a file).
        option: the option or setting that named it, for the hint.

    Raises:
        OutputLocationError: ``out`` is of the other kind, or sits under a file or an
            unwritable folder.
    """
    out = Path(out)
    if out.exists() and out.is_dir() != folder:
        kind = "a folder" if folder else "a file"
        raise OutputLocationError(f"the output exists and is not {kind}", where=str(out),
                                  hint=f"pass the path of {kind} to {option}")
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
                                  where=str(out), hint=f"choose another {option}") from None
    return out


def refuse_output_over_inputs(out: str | Path, inputs: Iterable[str | Path | None]) -> None:
    """Refuse an output that is, holds or lies inside one of a command's inputs.

    Replacing such an output (``--overwrite``) would delete the input (``quantize
    --checkpoint run --out run`` deleted the training run), and writing inside one changes it
    (scores written over a dataset's split file or an artifact's manifest).

    Args:
        out: the output folder or file.
        inputs: the folders and files the command reads (None entries are skipped).

    Raises:
        ConfigError: naming both paths, before anything is written.
    """
    target = Path(out).resolve()
    for path in inputs:
        if path is None:
            continue
        source = Path(path).resolve()
        if source == target:
            what = "is an input"
        elif target in source.parents:
            what = "contains an input"
        elif source in target.parents:
            what = "is inside an input"
        else:
            continue
        kind = "folder" if target.is_dir() or not target.suffix else "file"
        raise ConfigError(f"the output {kind} {what}", where=f"--out {out} and {path}",
                          hint="choose an --out outside the command's inputs")


#: What an OS error says when the disk took no more of an output: errno, and the text that
#: libraries which wrap the error (safetensors, pyarrow, polars) keep of it.
_WRITE_FAILURES = {
    errno.ENOSPC: "No space left on device",
    errno.EDQUOT: "Disk quota exceeded",
    errno.EROFS: "Read-only file system",
    errno.EFBIG: "File too large",
}


def write_failure(exc: BaseException) -> str | None:
    """Why the disk refused a write, if ``exc`` (or an error it was raised from) says so.

    Returns:
        "no space left on device" and the like, or None for any other error.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        number = current.errno if isinstance(current, OSError) else None
        text = str(current)
        for code, words in _WRITE_FAILURES.items():
            if number == code or words in text:
                return words[0].lower() + words[1:]
        current = current.__cause__ or current.__context__
    return None


@contextmanager
def writing(out: str | Path, kept: str = "nothing partial was left") -> Iterator[None]:
    """Turn a full, over-quota or read-only disk under ``out`` into one error naming ``out``
    (not the input being read when the disk filled, nor a library's traceback). Wrap the code
    that writes ``out`` and cleans up its temp files when it fails.

    Args:
        out: the output the command writes.
        kept: what is left on disk, for the message ("the previous checkpoint is kept").

    Raises:
        DiskRefusedError: the disk refused a write (an OutputLocationError).
    """
    try:
        yield
    except Exception as exc:
        reason = write_failure(exc)
        # One naming the file it could not write (a cached table's) stays; a nested
        # writing's (a temp folder's) is said as ``out``'s.
        if reason is None or type(exc) is OutputLocationError:
            raise
        raise DiskRefusedError(f"cannot write the output: {reason} ({kept})", where=str(out),
                               hint="free space there or choose another --out") from exc


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
        OutputLocationError: the lock file cannot be created there (a read-only disk).
    """
    path = lock_path(out, name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OutputLocationError(f"cannot create the output's lock file {path} "
                                  f"({exc.strerror})", where=str(out),
                                  hint="write the output on a writable disk") from None
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
