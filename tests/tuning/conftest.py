"""Training tests run torch on one intra-op thread.

Their models are tiny: with two threads on a busy two-core machine every small op waits for
the second thread to be scheduled, which made these tests several times slower and no more
telling.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ctrctl.testing.threads import torch_threads


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with torch_threads(1):
        yield
