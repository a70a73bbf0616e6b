"""Checksums of a checkpoint's files: recorded when written, verified before each is read.

``metadata.json`` lists every other file of its step folder with its size and sha256::

    "files": {"dense.safetensors": {"bytes": 52344, "sha256": "9f2c..."},
              "tables/C1/0-0.safetensors": {...}, "rng/0.safetensors": {...}, ...}

A file that is missing, shorter or longer than recorded, or whose bytes changed (a flipped
bit, a pickle swapped in) is refused with one error naming it, before any of it is parsed.
Checkpoints written before checksums existed have no ``files`` and are read unverified.

Example:
    >>> entry = file_record(step_folder, "dense.safetensors")
    >>> verify_file(step_folder, "dense.safetensors", {"dense.safetensors": entry})
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ctrctl.errors import CheckpointError
from ctrctl.io import file_sha256

_HINT = "the checkpoint is damaged or incomplete: resume from an earlier step or retrain"


def file_record(folder: Path, rel: str) -> dict[str, Any]:
    """``{"bytes", "sha256"}`` of ``folder / rel``."""
    path = folder / rel
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path)}


@functools.lru_cache(maxsize=4096)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file, once per (path, size, modification time): a checkpoint loaded by
    several calls (tables, dense state, trainer state) is hashed once."""
    return file_sha256(path)


def verify_file(folder: Path, rel: str, files: Mapping[str, Mapping[str, Any]]) -> Path:
    """``folder / rel`` after checking it against its record (none recorded: unchecked).

    Raises:
        CheckpointError: the file is missing, of another size, or its sha256 differs.
    """
    path = folder / rel
    expected = files.get(rel)
    if not path.is_file():
        raise CheckpointError("a file of the checkpoint is missing", where=str(path),
                              hint=_HINT)
    if expected is None:
        return path
    stat = path.stat()
    if stat.st_size != int(expected["bytes"]):
        raise CheckpointError(
            f"the file has {stat.st_size:,} bytes, {int(expected['bytes']):,} were written "
            f"({'truncated' if stat.st_size < int(expected['bytes']) else 'grown'})",
            where=str(path), hint=_HINT)
    if _digest(str(path), stat.st_size, stat.st_mtime_ns) != expected["sha256"]:
        raise CheckpointError("the file's contents changed since it was written (sha256 "
                              "differs from metadata.json)", where=str(path), hint=_HINT)
    return path


def unreadable(path: Path, exc: BaseException) -> CheckpointError:
    """One error for a checkpoint file its reader refused (an unverified old checkpoint)."""
    return CheckpointError(f"cannot read the file ({type(exc).__name__}: {exc})",
                           where=str(path), hint=_HINT)
