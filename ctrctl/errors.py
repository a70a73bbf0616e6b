"""Errors that ctrctl raises on purpose.

Every error a user can cause is a :class:`CtrctlError`. Its message says what was wrong,
where (file, line, column, feature, rank) and what to do; the CLI prints it as one line and
exits non-zero, with a traceback only under ``--verbose``. Anything else that escapes is a bug.

Example:
    >>> raise SchemaError("column 'C27' is not in the schema", where="schemas/criteo.yaml",
    ...                   hint="add it under `columns:` or drop it from the input")
"""

from __future__ import annotations


class CtrctlError(Exception):
    """Base of every error meant for a user.

    Args:
        message: what was wrong.
        where: the place it was found (a path, ``path:line:column``, a feature, a rank).
        hint: what to do about it.
    """

    exit_code = 1

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None):
        self.message = message
        self.where = where
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.hint:
            text += f" ({self.hint})"
        return text


class ConfigError(CtrctlError):
    """A pipeline config, override or command-line value is invalid."""


class SchemaError(CtrctlError):
    """A feature schema is invalid or does not match the input."""


class InputDataError(CtrctlError):
    """Raw input logs are missing, empty or malformed."""


class DatasetError(CtrctlError):
    """A preprocessed dataset (manifest, Parquet) is missing or inconsistent."""


class OutputExistsError(CtrctlError):
    """An output already exists and would be overwritten."""


class OutputLocationError(CtrctlError):
    """An output path cannot be written: it is a file, or its folder is not writable."""


class DiskRefusedError(OutputLocationError):
    """The disk refused a write of an output (full, over quota, read-only)."""


class OutputLockedError(CtrctlError):
    """Another process is writing the same output."""


class FormatError(CtrctlError):
    """A versioned file (manifest, plan, checkpoint metadata) is invalid or of another version."""


class SparseInputError(CtrctlError):
    """A jagged tensor is malformed: lengths, offsets or ids out of range."""


class PlanError(CtrctlError):
    """A sharding plan is invalid, or no plan fits the topology."""


class CheckpointError(CtrctlError):
    """A checkpoint is missing, incomplete or incompatible."""


class DistributedError(CtrctlError):
    """A collective failed or another rank failed."""


class TrackingError(CtrctlError):
    """The MLflow tracking store or server cannot be used."""


class GateError(CtrctlError):
    """An evaluation gate failed (exit code 3: apart from usage errors, which exit 2)."""

    exit_code = 3


class EnvironmentMismatchError(CtrctlError):
    """The installed torch and fbgemm_gpu do not pair."""
