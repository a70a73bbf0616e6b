"""Files in and out: reading a user's text files, and where outputs may go.

Every file a user names (schema, config, plan, topology, tables, manifest) is read through
:func:`read_text`, so a missing, unreadable or binary file is one clear error naming it;
every output folder a command takes is checked by :func:`check_output_location` before any
work starts.

Example:
    >>> text = read_text("schemas/criteo.yaml", SchemaError, what="schema")
    >>> check_output_location(Path("runs/r1"))
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ctrctl.errors import CtrctlError, OutputLocationError


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
