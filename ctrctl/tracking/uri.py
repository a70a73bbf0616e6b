"""Tracking URIs: the up-front check of a URI, and where a URI's journals are spooled.

Nothing here imports MLflow.
"""

from __future__ import annotations

import hashlib
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from ctrctl.errors import TrackingError

_TRACKING_HINT = "start the server, fix --tracking-uri / MLFLOW_TRACKING_URI, or pass --no-track"
#: URI schemes a tracker accepts: local stores and MLflow servers.
LOCAL_SCHEMES = ("", "file", "sqlite", "postgresql", "mysql", "mssql")
SERVER_SCHEMES = ("http", "https")
#: Seconds the up-front probe of a tracking server waits for its answer.
PROBE_TIMEOUT_S = 5.0
#: The spool folder (journals waiting for a store) beside a local store, or under the user's
#: cache for a server.
SPOOL_DIR = Path(".ctrctl") / "spool"


def check_tracking_uri(uri: str | None, timeout_s: float = PROBE_TIMEOUT_S,
                       probe: bool = True) -> None:
    """Fail fast, in one line, on a tracking URI that cannot work.

    An unknown scheme is refused; a server (http/https) must answer its ``/health`` endpoint
    within ``timeout_s`` seconds (``probe=False``: the scheme only, for background tracking,
    whose journal waits for a server that is away). Local stores are left to MLflow (it
    creates them).

    Raises:
        TrackingError: naming the URI and suggesting ``--no-track``.
    """
    if not uri:
        return
    hint = _TRACKING_HINT
    scheme = urllib.parse.urlsplit(uri).scheme.lower()
    if len(scheme) == 1:  # a Windows drive letter, C:\\...
        scheme = ""
    if scheme.startswith("databricks") or scheme in LOCAL_SCHEMES:
        return
    if scheme.split("+")[0] in LOCAL_SCHEMES[3:]:  # postgresql+psycopg2://...
        return
    if scheme not in SERVER_SCHEMES:
        raise TrackingError(
            f"unknown tracking URI scheme {scheme!r}", where=uri,
            hint="use http(s)://HOST:PORT, sqlite:///FILE.db or a folder, or pass --no-track")
    if not probe:
        return
    health = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(health, timeout=timeout_s) as answer:
            status = answer.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise TrackingError(f"tracking server does not answer ({reason})", where=uri,
                            hint=hint) from None
    if status >= 500:
        raise TrackingError(f"tracking server answered HTTP {status}", where=uri, hint=hint)
    if status not in (200, 401, 403):  # MLflow answers 200 "OK"; 401/403: a proxy's login
        raise TrackingError(f"this is not an MLflow tracking server: {health} answered HTTP "
                            f"{status}", where=uri, hint=hint)



def _sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URI (None for other URIs)."""
    if not uri.startswith("sqlite:///"):
        return None
    return Path(uri.removeprefix("sqlite:///"))


def absolute_uri(uri: str | None, cwd: Path) -> str | None:
    """``uri`` with a relative sqlite file or store folder made absolute against ``cwd``, so
    a process started elsewhere (the replayer) opens the same store. None stays None: MLflow's
    default store, resolved in the journal's recorded working folder."""
    if not uri:
        return None
    database = _sqlite_path(uri)
    if database is not None:
        return f"sqlite:///{(cwd / database).resolve()}"
    scheme = urllib.parse.urlsplit(uri).scheme.lower()
    if scheme == "" or len(scheme) == 1:  # a folder (file store), or C:\...
        return str((cwd / uri).resolve())
    return uri


def spool_folder(uri: str | None, cwd: Path) -> Path:
    """Where the journals of ``uri`` wait: ``.ctrctl/spool/<store>`` beside a local store
    (``default`` for MLflow's default store in ``cwd``), ``~/.cache/ctrctl/spool/<host>-<hash>``
    for a server or database."""
    uri = absolute_uri(uri, cwd)
    if uri is None:
        return cwd / SPOOL_DIR / "default"
    database = _sqlite_path(uri)
    if database is not None:
        return database.parent / SPOOL_DIR / database.name
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme.lower() in ("", "file") or len(parts.scheme) == 1:
        folder = Path(parts.path if parts.scheme.lower() == "file" else uri)
        return folder.parent / SPOOL_DIR / folder.name
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    host = re.sub(r"[^A-Za-z0-9.-]", "_", parts.hostname or parts.scheme)[:40]
    digest = hashlib.sha256(uri.encode()).hexdigest()[:10]
    return cache / "ctrctl" / "spool" / f"{host}-{digest}"
