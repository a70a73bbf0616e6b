"""Shared fixtures: the real data samples in ../shared/data (skipped when absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Tests inspect MLflow right after a command: its runs are sent before it exits. Background
# tracking has its own tests (tests/tracking/), which set the mode themselves.
os.environ["CTRCTL_TRACKING_MODE"] = "sync"

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def shared_data(name: str) -> Path:
    """A folder of ../shared/data, or skip the test when it is absent (e.g. outside CI)."""
    path = SHARED_DATA / name
    if not path.is_dir():
        pytest.skip(f"{path} is absent: the licensed samples live only beside the project")
    return path


@pytest.fixture
def criteo_8k() -> Path:
    return shared_data("criteo-kaggle-8k")


@pytest.fixture
def avazu_9k() -> Path:
    return shared_data("avazu-9k")


@pytest.fixture(autouse=True)
def _seeded_rngs() -> None:
    """Every test starts from the same random state, so a pass or a failure repeats."""
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
