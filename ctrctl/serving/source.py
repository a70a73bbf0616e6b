"""Where a served model comes from: an export folder, or a version in the MLflow registry.

``models:/NAME@ALIAS`` and ``models:/NAME/VERSION`` name a registered version of the
artifact's pyfunc model (``ctrctl run`` registers one); its ``artifacts/export`` folder is
downloaded once into a local cache (``<cache>/<name>/<version>``, staged then renamed) and
its files checked against the manifest's sha256 before it is used, each time it is used.

Example:
    >>> source = ModelSource.parse("models:/ctr@champion")
    >>> resolved = source.resolve()                  # Resolved(version="7", folder=...)
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrctl.errors import ConfigError, TrackingError
from ctrctl.inference import standalone

_REGISTRY = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))$")


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ctrctl" / "models"


@dataclass(frozen=True)
class Resolved:
    """A model ready to load: its folder (verified), name, version and lineage tags."""

    uri: str
    name: str
    version: str
    folder: Path
    tags: dict[str, str] = field(default_factory=dict)

    def info(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "uri": self.uri}


@dataclass(frozen=True)
class ModelSource:
    """A MODEL argument of ``ctrctl serve``.

    Args:
        uri: an export folder, ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``.
        tracking_uri: the MLflow store of the registry (MLflow's default when None).
        cache: where registry models are downloaded.
    """

    uri: str
    tracking_uri: str | None = None
    cache: Path = field(default_factory=default_cache)

    @classmethod
    def parse(cls, uri: str, tracking_uri: str | None = None,
              cache: Path | None = None) -> ModelSource:
        if uri.startswith("models:/") and not _REGISTRY.match(uri):
            raise ConfigError(f"model URI {uri!r} is not models:/NAME@ALIAS or "
                              "models:/NAME/VERSION", where="MODEL")
        if not uri.startswith("models:/") and not Path(uri).is_dir():
            raise ConfigError(f"{uri}: no such export folder", where="MODEL",
                              hint="pass the folder `ctrctl quantize --out` wrote, or a "
                                   "models:/ URI")
        return cls(uri, tracking_uri, cache or default_cache())

    @property
    def is_alias(self) -> bool:
        match = _REGISTRY.match(self.uri)
        return bool(match and match["alias"])

    def _client(self) -> Any:
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.tracking_uri)

    def current_version(self) -> str:
        """The version the URI names now (an alias moves; a folder's is its manifest hash)."""
        match = _REGISTRY.match(self.uri)
        if match is None:
            digest = standalone.sha256_file(str(Path(self.uri) / standalone.MANIFEST))
            return f"local-{digest[:12]}"
        if match["version"]:
            return str(match["version"])
        try:
            return str(self._client().get_model_version_by_alias(match["name"],
                                                                 match["alias"]).version)
        except Exception as exc:  # MlflowException, a store that cannot be reached
            raise TrackingError(f"cannot resolve {self.uri}: {exc}", where=self.uri,
                                hint="check the alias and MLFLOW_TRACKING_URI") from None

    def resolve(self, version: str | None = None) -> Resolved:
        """Download (once) and verify ``version`` (default: the current one)."""
        match = _REGISTRY.match(self.uri)
        if match is None:
            folder = Path(self.uri)
            standalone.verify(str(folder))
            return Resolved(self.uri, folder.resolve().name, version or self.current_version(),
                            folder)
        name = match["name"]
        version = version or self.current_version()
        client = self._client()
        try:
            entry = client.get_model_version(name, version)
        except Exception as exc:
            raise TrackingError(f"cannot read version {version} of {name}: {exc}",
                                where=self.uri) from None
        folder = self._download(name, version)
        standalone.verify(str(folder))
        return Resolved(self.uri, name, version, folder, dict(entry.tags or {}))

    def _download(self, name: str, version: str) -> Path:
        safe = hashlib.sha256(f"{self.tracking_uri}|{name}".encode()).hexdigest()[:8]
        final = self.cache / f"{name}-{safe}" / version
        if (final / standalone.MANIFEST).is_file():
            return final
        import mlflow.artifacts

        final.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{version}.tmp-", dir=final.parent))
        try:
            mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{name}/{version}",
                                                dst_path=str(stage),
                                                tracking_uri=self.tracking_uri)
            found = [p.parent for p in stage.rglob(standalone.MANIFEST)
                     if p.parent.name == "export"]
            if not found:
                raise ConfigError(f"version {version} of {name} holds no export folder",
                                  where=self.uri, hint="register a ctrctl pyfunc model")
            standalone.verify(str(found[0]))
            try:
                os.replace(found[0], final)
            except OSError:  # another worker got there first
                if not (final / standalone.MANIFEST).is_file():
                    raise
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        return final
