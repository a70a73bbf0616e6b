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


def _reuse_body(rank: int, world_size: int) -> bool:
    """Reduce-scatter (gloo: an all-to-all and a local sum) and the placed all-to-all with
    reused buffers: the sums are right, memory comes back only when nothing holds it."""
    batch = [4, 4, 4]
    buffers = comm.OutputDistBuffers()
    outputs = []
    for step in range(3):
        gen = torch.Generator().manual_seed(100 * step + rank)
        partial = torch.randn(sum(batch), 6, generator=gen, dtype=torch.float64)
        every = [torch.randn(sum(batch), 6, generator=torch.Generator().manual_seed(100 * step + r),
                             dtype=torch.float64) for r in range(world_size)]
        assert torch.equal(every[rank], partial)
        mine = slice(4 * rank, 4 * rank + 4)
        x = partial.clone().requires_grad_()
        out = comm.reduce_scatter_rows(x, batch, grad_scale=0.5, buffers=buffers)
        torch.testing.assert_close(out, sum(p[mine] for p in every))
        upstream = torch.full((4, 6), float(rank + 1), dtype=torch.float64)
        out.backward(upstream)
        assert x.grad is not None  # every rank's rows: its upstream, halved
        torch.testing.assert_close(x.grad, torch.cat(
            [torch.full((4, 6), (r + 1) / 2, dtype=torch.float64) for r in range(world_size)]))
        outputs.append(out.data_ptr())
        if step == 0:
            held = out  # still referenced: step 1 must not reuse its memory
        else:
            del held
            held = None
        del out, x
    assert outputs[1] != outputs[0]  # step 0's output was held
    assert outputs[2] == outputs[1]  # step 1's was not: its memory came back
    return True


@pytest.mark.distributed
def test_output_dist_buffers_are_reused_only_when_free() -> None:
    assert run_multiprocess(_reuse_body, 3, timeout_s=60) == [True, True, True]


def test_reusable_buffer() -> None:
    from ctrctl.modules.native.buffers import ReusableBuffer

    buffer = ReusableBuffer()
    a = buffer.get((3, 4))
    a_ptr = a.data_ptr()
    view = a[1:]
    del a
    b = buffer.get((3, 4))  # the view holds the memory
    assert b.data_ptr() != a_ptr and b.shape == (3, 4) and b.is_contiguous()
    del view, b
    c = buffer.get((2, 5))  # smaller: the same memory
    d_ptr = c.data_ptr()
    del c
    assert buffer.get((2, 2), torch.float64).dtype == torch.float64  # another dtype: new
    e = buffer.get((30, 40))  # larger: new
    assert e.numel() == 1200 and e.data_ptr() != d_ptr
