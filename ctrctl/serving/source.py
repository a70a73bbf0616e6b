"""Where a served model comes from: an export folder, or a version in the MLflow registry.

``models:/NAME@ALIAS`` and ``models:/NAME/VERSION`` name a registered version of the
artifact's pyfunc model (``ctrctl run`` registers one); its ``artifacts/export`` folder is
downloaded once into a local cache (``<cache>/<name>/<version>``, staged then renamed) and
its files checked against the manifest's sha256 before it is used, each time it is used.

A source of ``bundle=True`` names a recommendation bundle (:mod:`ctrctl.inference.bundle`):
a bundle folder, or a registered version tagged ``ctrctl.kind: recommend_bundle`` whose
run's ``model`` folder is downloaded the same way. Its :class:`Resolved` folder is the
bundle's ranker and ``bundle`` the bundle, checked against ``bundle.json``; a version of
another kind is refused (an alias moved to a plain ranker).

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctrctl.errors import ConfigError, TrackingError
from ctrctl.inference import standalone
from ctrctl.inference.bundle import BUNDLE_FILE, BUNDLE_KIND, is_bundle, verify_bundle

#: ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``.
REGISTRY_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))$")


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ctrctl" / "models"


@dataclass(frozen=True)
class Resolved:
    """A model ready to load: its folder (verified), name, version and lineage tags;
    ``bundle``: the recommendation bundle the folder is the ranker of (None: an export)."""

    uri: str
    name: str
    version: str
    folder: Path
    tags: dict[str, str] = field(default_factory=dict)
    bundle: Path | None = None

    def info(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "uri": self.uri}


@dataclass(frozen=True)
class ModelSource:
    """A MODEL argument of ``ctrctl serve``.

    Args:
        uri: an export folder, ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``.
        tracking_uri: the MLflow store of the registry (MLflow's default when None).
        cache: where registry models are downloaded.
        bundle: the URI names a recommendation bundle (see the module docstring).
    """

    uri: str
    tracking_uri: str | None = None
    cache: Path = field(default_factory=default_cache)
    bundle: bool = False

    @classmethod
    def parse(cls, uri: str, tracking_uri: str | None = None,
              cache: Path | None = None, bundle: bool = False) -> ModelSource:
        if uri.startswith("models:/") and not REGISTRY_URI.match(uri):
            raise ConfigError(f"model URI {uri!r} is not models:/NAME@ALIAS or "
                              "models:/NAME/VERSION", where="MODEL")
        if not uri.startswith("models:/") and not Path(uri).is_dir():
            raise ConfigError(f"{uri}: no such export folder", where="MODEL",
                              hint="pass the folder `ctrctl quantize --out` wrote, or a "
                                   "models:/ URI")
        return cls(uri, tracking_uri, cache or default_cache(), bundle)

    @property
    def is_alias(self) -> bool:
        match = REGISTRY_URI.match(self.uri)
        return bool(match and match["alias"])

    def _client(self) -> Any:
        from mlflow.tracking import MlflowClient

        return MlflowClient(tracking_uri=self.tracking_uri)

    def current_version(self) -> str:
        """The version the URI names now (an alias moves; a folder's is its manifest hash)."""
        match = REGISTRY_URI.match(self.uri)
        if match is None:
            named = BUNDLE_FILE if self.bundle else standalone.MANIFEST
            digest = standalone.sha256_file(str(Path(self.uri) / named))
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
        match = REGISTRY_URI.match(self.uri)
        if match is None:
            folder = Path(self.uri)
            if self.bundle:
                return self._bundle(folder, folder.resolve().name, version, {})
            standalone.verify(str(folder))
            return Resolved(self.uri, folder.resolve().name, version or self.current_version(),
                            folder)
        name = match["name"]
        version = version or self.current_version()
        entry = self._entry(name, version)
        tags = dict(entry.tags or {})
        if self.bundle:
            if tags.get("ctrctl.kind") != BUNDLE_KIND:
                raise ConfigError(f"version {version} of {name} is not a recommendation "
                                  f"bundle (tag ctrctl.kind is {tags.get('ctrctl.kind')!r})",
                                  where=self.uri, hint="point the alias at a version "
                                  "registered by ctrctl quantize --index --ranker --register-as")
            folder = self._download_bundle(name, version, str(entry.run_id))
            return self._bundle(folder, name, version, tags)
        folder = self._download(name, version)
        standalone.verify(str(folder))
        return Resolved(self.uri, name, version, folder, tags)

    def registered_kind(self) -> str | None:
        """The ``ctrctl.kind`` tag of the version a registry URI names now (None: a
        folder, or no such tag)."""
        match = REGISTRY_URI.match(self.uri)
        if match is None:
            return None
        return (self._entry(match["name"], self.current_version()).tags or {}).get(
            "ctrctl.kind")

    def _entry(self, name: str, version: str) -> Any:
        try:
            return self._client().get_model_version(name, version)
        except Exception as exc:
            raise TrackingError(f"cannot read version {version} of {name}: {exc}",
                                where=self.uri) from None

    def _bundle(self, folder: Path, name: str, version: str | None, tags: dict[str, str]
                ) -> Resolved:
        """A bundle folder checked (``bundle.json`` against both manifests, the ranker's
        files against its manifest; the retrieval export checks its own when loaded)."""
        verify_bundle(folder)
        standalone.verify(str(folder / "ranker"))
        return Resolved(self.uri, name, version or self.current_version(), folder / "ranker",
                        tags, folder)

    def _download_bundle(self, name: str, version: str, run_id: str) -> Path:
        """The bundle of a registered version in the cache (downloaded once, staged)."""

        def pick(stage: Path) -> Path:
            found = [p.parent for p in stage.rglob(BUNDLE_FILE)]
            if not found:
                raise ConfigError(f"version {version} of {name} holds no {BUNDLE_FILE}",
                                  where=self.uri, hint="register a bundle made by ctrctl "
                                  "quantize --index --ranker")
            verify_bundle(found[0])
            return found[0]

        # the run's "model" (a bundle is registered from runs:/RUN/model): a runs:/ URI
        # resolves through the tracking URI given here, a models:/ one through the global one
        return self._fetch(self._cached(name, "-bundle") / version, f"runs:/{run_id}/model",
                           pick, is_bundle)

    def _download(self, name: str, version: str) -> Path:
        """The export of a registered pyfunc version in the cache (downloaded once, staged)."""

        def pick(stage: Path) -> Path:
            found = [p.parent for p in stage.rglob(standalone.MANIFEST)
                     if p.parent.name == "export"]
            if not found:
                raise ConfigError(f"version {version} of {name} holds no export folder",
                                  where=self.uri, hint="register a ctrctl pyfunc model")
            standalone.verify(str(found[0]))
            return found[0]

        return self._fetch(self._cached(name, "") / version, f"models:/{name}/{version}", pick,
                           lambda folder: (folder / standalone.MANIFEST).is_file())

    def _cached(self, name: str, suffix: str) -> Path:
        safe = hashlib.sha256(f"{self.tracking_uri}|{name}".encode()).hexdigest()[:8]
        return self.cache / f"{name}-{safe}{suffix}"

    def _fetch(self, final: Path, artifact_uri: str, pick: Callable[[Path], Path],
               ready: Callable[[Path], bool]) -> Path:
        """``final`` once ``ready``: else ``artifact_uri`` downloaded into a staging folder
        beside it, ``pick`` choosing (and verifying) the folder to keep, moved in whole."""
        if ready(final):
            return final
        import mlflow.artifacts

        final.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            mlflow.artifacts.download_artifacts(artifact_uri=artifact_uri, dst_path=str(stage),
                                                tracking_uri=self.tracking_uri)
            found = pick(stage)
            try:
                os.replace(found, final)
            except OSError:  # another worker got there first
                if not ready(final):
                    raise
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        return final
