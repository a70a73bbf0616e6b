"""Torch's intra-op thread count, set for a block and restored after it.

Tests of tiny models run on one thread: on a busy two-core machine two threads make every
small op wait for the second one to be scheduled.

Example:
    >>> with torch_threads(1):
    ...     train(dataset, out, config)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(count)``, then restore the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
