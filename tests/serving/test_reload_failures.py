"""A hot reload whose new version does not load: the old slot keeps serving, each try is
counted, and the warning is logged once per failed version (no model is loaded here)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from ctrctl.serving.config import ServeConfig
from ctrctl.serving.metrics import Metrics
from ctrctl.serving.models import Reloader, Router, Slot
from ctrctl.serving.source import ModelSource, Resolved


def _failures(metrics: Metrics) -> float:
    value = metrics.registry.get_sample_value("ctrctl_reload_failures_total",
                                              {"role": "primary"})
    return value or 0.0


def test_a_version_that_fails_to_load_is_counted_and_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # a folder that claims to be a bundle of another kind: it resolves to a version but
    # fails the bundle check when loaded
    folder = tmp_path / "not-a-bundle"
    folder.mkdir()
    (folder / "bundle.json").write_text(json.dumps({"kind": "something_else"}))
    source = ModelSource.parse(str(folder), bundle=True)
    serving: Any = Slot("primary", Resolved("models:/rec@live", "rec", "1", tmp_path), None,
                        None)
    router = Router(serving)
    metrics = Metrics()
    reloader = Reloader(router, {"primary": source}, ServeConfig(model=str(folder)), metrics)

    async def three_polls() -> list[bool]:
        return [await reloader.check("primary", source) for _ in range(3)]

    with caplog.at_level(logging.WARNING, logger="ctrctl.serving.models"):
        assert asyncio.run(three_polls()) == [False, False, False]
    assert router.slots["primary"] is serving and reloader.swaps == 0
    assert _failures(metrics) == 3
    warnings = [r.getMessage() for r in caplog.records if "could not be loaded" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "still serving version 1" in warnings[0]
    assert "is not of kind recommend_bundle" in warnings[0]
    assert reloader.failed == {"primary": source.current_version()}
