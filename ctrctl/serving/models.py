"""The models a server holds: loading and warming, the canary split, hot reload (blue/green).

A :class:`Slot` is one loaded version with its own batcher. The :class:`Router` holds the
primary slot and an optional canary; a request goes to the canary when its id hashes into
the canary's share (deterministic: the same id always lands on the same side). With an alias
URI a :class:`Reloader` resolves the alias every ``poll_s``; a new version is downloaded,
verified, loaded and warmed beside the serving one, then swapped in by one assignment; the
old slot's batcher scores what it already queued and stops. A request that reached the old
slot after that is sent to the new one, so none fails during a swap.

A slot of a recommendation bundle also holds the bundle's retrieval stage
(:class:`~ctrctl.inference.bundle.Bundle`): both stages of a new version are loaded
together and swapped in by the same assignment, so a request is answered by one version's
retrieval and ranker. A new version that fails to load (a bad file, an alias moved to a
model of another kind) leaves the old one serving: one warning line per version and
``ctrctl_reload_failures_total`` counted at each failed try.

Example:
    >>> router = Router(await load_slot(source, None, config, metrics, "primary"))
    >>> slot = router.pick(request_id)
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from ctrctl.inference import standalone
from ctrctl.inference.bundle import Bundle, load_bundle_retrieval
from ctrctl.serving import model_api
from ctrctl.serving.batcher import Batcher
from ctrctl.serving.config import ServeConfig
from ctrctl.serving.metrics import Metrics
from ctrctl.serving.source import ModelSource, Resolved

logger = logging.getLogger(__name__)

WARM_ROWS = 256


@dataclass
class Slot:
    role: str  # primary | canary
    resolved: Resolved
    model: Any
    batcher: Batcher
    bundle: Bundle | None = None  # the retrieval stage, when serving a bundle

    @property
    def version(self) -> str:
        return self.resolved.version


def _load(source: ModelSource, version: str | None, config: ServeConfig, metrics: Metrics,
          role: str) -> tuple[Resolved, Any, Batcher, Bundle | None]:
    resolved = source.resolve(version)
    bundle = None
    if resolved.bundle is not None:
        info, retrieval = load_bundle_retrieval(resolved.bundle)
        bundle = Bundle(resolved.bundle, info, retrieval, None)  # ranks through the batcher
    model = standalone.load(str(resolved.folder), verify_key=config.verify_key)
    batcher = Batcher(model, metrics, resolved.version, max_batch_rows=config.max_batch_rows,
                      max_wait_s=config.max_wait_ms / 1000.0,
                      max_queue_rows=config.max_queue_rows)
    rows = min(WARM_ROWS, config.max_batch_rows)
    batcher.warm({name: [None] * rows for name in model_api.input_columns(model)}, rows)
    return resolved, model, batcher, bundle


async def load_slot(source: ModelSource, version: str | None, config: ServeConfig,
                    metrics: Metrics, role: str) -> Slot:
    """Resolve, verify, load and warm a model (and a bundle's retrieval stage) off the
    event loop; start its batcher."""
    resolved, model, batcher, bundle = await asyncio.to_thread(_load, source, version, config,
                                                               metrics, role)
    batcher.start()
    metrics.model_info.labels(role, resolved.version).set(1)
    occupancy = getattr(model, "zch_occupancy", None)
    for feature, share in (occupancy() if occupancy is not None else {}).items():
        metrics.zch_occupancy.labels(feature, resolved.version).set(share)
    logger.info("%s model %s version %s loaded from %s", role, resolved.name,
                resolved.version, resolved.folder)
    return Slot(role, resolved, model, batcher, bundle)


def canary_bucket(request_id: str) -> float:
    """A request id's place in [0, 100): the same id, the same place."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 10_000 / 100.0


class Router:
    """The serving slots and the canary split."""

    def __init__(self, primary: Slot, canary: Slot | None = None,
                 canary_percent: float = 0.0) -> None:
        self.slots: dict[str, Slot] = {"primary": primary}
        if canary is not None:
            self.slots["canary"] = canary
        self.canary_percent = canary_percent

    def pick(self, request_id: str) -> Slot:
        canary = self.slots.get("canary")
        if canary is not None and canary_bucket(request_id) < self.canary_percent:
            return canary
        return self.slots["primary"]

    async def swap(self, new: Slot, metrics: Metrics) -> None:
        """Serve ``new`` in its role from now on; drain and stop the slot it replaces."""
        old = self.slots[new.role]
        self.slots[new.role] = new
        await old.batcher.stop()
        metrics.model_info.labels(old.role, old.version).set(0)
        logger.info("%s model swapped: version %s -> %s", new.role, old.version, new.version)

    async def stop(self) -> None:
        for slot in self.slots.values():
            await slot.batcher.stop()


class Reloader:
    """Polls the registry for each alias URI and swaps in new versions."""

    def __init__(self, router: Router, sources: dict[str, ModelSource], config: ServeConfig,
                 metrics: Metrics) -> None:
        self.router = router
        self.sources = {role: s for role, s in sources.items() if s.is_alias}
        self.config = config
        self.metrics = metrics
        self.swaps = 0
        self.failed: dict[str, str] = {}  # role -> the last version that failed to load

    async def run(self) -> None:
        if not self.sources or self.config.poll_s <= 0:
            return
        while True:
            await asyncio.sleep(self.config.poll_s)
            for role, source in self.sources.items():
                try:
                    await self.check(role, source)
                except Exception as exc:  # the registry away: keep serving
                    self.metrics.reload_failures.labels(role).inc()
                    logger.warning("reload of %s failed, still serving version %s: %s",
                                   source.uri, self.router.slots[role].version, exc)

    async def check(self, role: str, source: ModelSource) -> bool:
        """Load and swap in the version the alias names now, if it is not the one serving.

        A version that fails to load is counted (``ctrctl_reload_failures_total``) and
        tried again at the next poll; the old version keeps serving, and the warning is
        logged once per failed version.

        Returns:
            Whether a new version was swapped in.
        """
        version = await asyncio.to_thread(source.current_version)
        serving = self.router.slots[role].version
        if version == serving:
            return False
        try:
            new = await load_slot(source, version, self.config, self.metrics, role)
        except Exception as exc:  # a bad new version, a model of another kind
            self.metrics.reload_failures.labels(role).inc()
            if self.failed.get(role) != version:
                logger.warning("%s version %s of %s could not be loaded, still serving "
                               "version %s: %s", role, version, source.uri, serving, exc)
            self.failed[role] = version
            return False
        await self.router.swap(new, self.metrics)
        self.failed.pop(role, None)
        self.swaps += 1
        return True
