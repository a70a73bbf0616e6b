"""What the runner remembers between runs: content hashes and one small state file per step.

A step is skipped when the key of what it reads (the sha256 of its input files and
folders) and of its settings equals the key recorded when it last completed, and its
outputs still hash to what it wrote. Hashing is cached by (path, size, mtime) so an
unchanged dataset of many gigabytes is not read again on every run.

Layout under the working folder::

    .ctrctl/state/<step>.json   status (running, completed, failed), key, outputs' hashes
    .ctrctl/hashes.json         path -> size, mtime_ns, sha256 of every file hashed
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrctl.errors import FormatError
from ctrctl.io import file_sha256, json_sha256, read_json_file, tree_sha256, write_json_atomic

logger = logging.getLogger(__name__)

STATE_VERSION = 1


def _valid(entry: Any) -> bool:
    """A hash cache entry as :meth:`HashCache.file` writes it."""
    return (isinstance(entry, dict) and isinstance(entry.get("size"), int)
            and isinstance(entry.get("mtime_ns"), int) and isinstance(entry.get("sha256"), str))


class HashCache:
    """sha256 of files, remembered by (absolute path, size, mtime_ns) in a JSON file."""

    def __init__(self, path: Path):
        self.path = path
        self._entries: dict[str, dict[str, Any]] = {}
        self._dirty = False
        try:
            data = read_json_file(path) if path.is_file() else {}
        except FormatError as exc:  # a cache: what cannot be read is hashed again
            logger.warning("%s; discarded, the files are hashed again", exc.render())
            data = None
        entries = data if isinstance(data, dict) else {}
        self._entries = {key: entry for key, entry in entries.items() if _valid(entry)}
        self._dirty = data is None or not isinstance(data, dict) or (
            len(self._entries) != len(entries))  # rewritten without what was discarded

    def file(self, path: Path) -> str:
        """The sha256 of ``path``, read again only when its size or mtime changed."""
        stat = path.stat()
        key = str(path.resolve())
        entry = self._entries.get(key)
        if entry and entry.get("size") == stat.st_size and entry.get("mtime_ns") == stat.st_mtime_ns:
            return str(entry["sha256"])
        digest = file_sha256(path)
        self._entries[key] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                              "sha256": digest}
        self._dirty = True
        return digest

    def tree(self, path: Path, files: Iterable[Path] | None = None) -> str:
        """sha256 over a file or a folder: each file's relative path, size and sha256, in
        path order (a rename, a new file or one changed byte changes it)."""
        return tree_sha256(path, files, self.file)

    def save(self) -> None:
        if self._dirty:
            write_json_atomic(self.path, self._entries)
            self._dirty = False


@dataclass
class StepState:
    """One step's record (``.ctrctl/state/<step>.json``).

    Attributes:
        step: the step's name.
        status: ``running`` (started, or killed while running), ``completed``, ``failed``.
        key: sha256 over the input hashes and the settings.
        inputs: input path -> sha256 (what the key was made of).
        outputs: output path -> sha256 when it completed.
        summary: what the step reported (key metric, run id, paths).
        error: the failure's message.
    """

    step: str
    status: str
    key: str
    inputs: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    updated: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "step": self.step, "status": self.status,
                "key": self.key, "inputs": self.inputs, "outputs": self.outputs,
                "summary": self.summary, "error": self.error, "updated": self.updated}


class StateStore:
    """The step states of one working folder."""

    def __init__(self, workdir: Path):
        self.folder = workdir / ".ctrctl" / "state"
        self.hashes = HashCache(workdir / ".ctrctl" / "hashes.json")

    def path(self, step: str) -> Path:
        return self.folder / f"{step}.json"

    def load(self, step: str) -> StepState | None:
        """The recorded state, or None when there is none (or it is unreadable: rerun)."""
        path = self.path(step)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text())
            if data.get("version") != STATE_VERSION:
                return None
            return StepState(step=data["step"], status=data["status"], key=data["key"],
                             inputs=dict(data.get("inputs", {})),
                             outputs=dict(data.get("outputs", {})),
                             summary=dict(data.get("summary", {})), error=data.get("error"),
                             updated=float(data.get("updated", 0.0)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            logger.warning("ignoring unreadable step state %s (%s): the step reruns", path, exc)
            return None

    def save(self, state: StepState) -> None:
        """Write the state atomically."""
        state.updated = time.time()
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path(state.step), state.to_dict())
        self.hashes.save()

    def hash_paths(self, paths: Mapping[str, Path]) -> dict[str, str]:
        """label -> sha256 of each path; a missing path hashes as ``missing``."""
        return {label: self.hashes.tree(path) if path.exists() else "missing"
                for label, path in paths.items()}

    def outputs_intact(self, state: StepState, outputs: Mapping[str, Path]) -> bool:
        """Every recorded output is there and hashes as it did."""
        if set(state.outputs) != set(outputs):
            return False
        return all(outputs[label].exists() and self.hashes.tree(outputs[label]) == digest
                   for label, digest in state.outputs.items())


def step_key(inputs: Mapping[str, str], settings: Mapping[str, Any]) -> str:
    """The key a step is skipped by: inputs' hashes and settings, canonically."""
    return json_sha256({"inputs": dict(inputs), "settings": dict(settings)})
