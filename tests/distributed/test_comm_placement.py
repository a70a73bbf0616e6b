"""The pooled all-to-all that copies blocks into their output columns equals the one that
places them side by side and permutes after (forward and backward, bitwise)."""

from __future__ import annotations

import pytest
import torch

from ctrctl.distributed import comm
from ctrctl.distributed.processes import run_multiprocess


def test_column_runs() -> None:
    assert comm.column_runs([]) == []
    assert comm.column_runs([3]) == [(0, 3, 1)]
    assert comm.column_runs([0, 1, 2, 3]) == [(0, 0, 4)]
    assert comm.column_runs([4, 5, 6, 0, 1, 9]) == [(0, 4, 3), (3, 0, 2), (5, 9, 1)]
    assert comm.column_runs([2, 1, 0]) == [(0, 2, 1), (1, 1, 1), (2, 0, 1)]


def _body(rank: int, world_size: int) -> bool:
    gen = torch.Generator().manual_seed(rank)
    widths = [5, 3]  # rank 0's block: 5 columns, rank 1's: 3
    batch = [4, 6]
    # where each received column goes in the (B, 8) output: interleaved runs
    targets = [6, 7, 0, 1, 2, 3, 4, 5]
    starts = [0, widths[0]]
    placement = (8, [comm.column_runs(targets[a:a + w]) for a, w in zip(starts, widths, strict=True)])
    local = torch.randn(sum(batch), widths[rank], generator=gen)
    upstream = torch.randn(batch[rank], 8, generator=gen)

    plain_in = local.clone().requires_grad_()
    side_by_side = comm.pooled_all_to_all(plain_in, batch, widths, grad_scale=0.5)
    gather = torch.argsort(torch.tensor(targets))
    expected = side_by_side.index_select(1, gather)
    expected.backward(upstream)

    placed_in = local.clone().requires_grad_()
    placed = comm.pooled_all_to_all(placed_in, batch, widths, grad_scale=0.5,
                                    placement=placement)
    placed.backward(upstream)
    assert placed.shape == (batch[rank], 8)
    assert torch.equal(placed, expected)
    assert plain_in.grad is not None and placed_in.grad is not None
    assert torch.equal(placed_in.grad, plain_in.grad)
    return True


@pytest.mark.distributed
def test_placed_all_to_all_equals_side_by_side_and_gather() -> None:
    assert run_multiprocess(_body, 2, timeout_s=60) == [True, True]
