"""Training tests run torch on one intra-op thread.

Their models are tiny: with two threads on a busy two-core machine every small op waits for
the second thread to be scheduled, which made these tests several times slower and no more
telling.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
