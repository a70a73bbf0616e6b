"""Jagged-layout kernels: FBGEMM's where it imports, plain torch everywhere else.

The two implementations give identical results; FBGEMM's are faster on CPU and are the ones
TorchRec uses. ctrctl must run on a torch without fbgemm_gpu (a GPU box with torch only), so
each op here checks :func:`ctrctl.compat.fbgemm_available` once and falls back.

Example:
    >>> lengths = torch.tensor([2, 0, 1])
    >>> complete_cumsum(lengths)          # tensor([0, 2, 2, 3])
"""

from __future__ import annotations

import functools

import torch

from ctrctl.compat import fbgemm_available


@functools.lru_cache(maxsize=1)
def use_fbgemm_ops() -> bool:
    """Whether ``torch.ops.fbgemm`` jagged kernels are loaded (imports fbgemm_gpu once)."""
    if not fbgemm_available():
        return False
    import fbgemm_gpu  # noqa: F401  registers torch.ops.fbgemm

    return hasattr(torch.ops.fbgemm, "permute_2D_sparse_data")


def complete_cumsum(lengths: torch.Tensor) -> torch.Tensor:
    """Offsets of a 1-D lengths tensor: ``[0, l0, l0+l1, ...]`` (one more entry than lengths).

    Args:
        lengths: 1-D integer tensor.

    Example:
        >>> complete_cumsum(torch.tensor([2, 0, 1]))   # tensor([0, 2, 2, 3])
    """
    if lengths.numel() == 0:
        return torch.zeros(1, dtype=lengths.dtype, device=lengths.device)
    if use_fbgemm_ops() and lengths.device.type == "cpu":
        return torch.ops.fbgemm.asynchronous_complete_cumsum(lengths)
    out = torch.zeros(lengths.numel() + 1, dtype=lengths.dtype, device=lengths.device)
    torch.cumsum(lengths, dim=0, out=out[1:])
    return out


def segment_ranges(offsets: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Indices ``cat(arange(offsets[s], offsets[e]) for s, e in zip(starts, ends))``, vectorised.

    Gathers whole runs of bags (e.g. all bags of one key) in a new order without a Python loop.
    """
    begin = offsets[starts]
    sizes = offsets[ends] - begin
    total = int(sizes.sum())
    if total == 0:
        return torch.zeros(0, dtype=torch.long, device=offsets.device)
    run_start = torch.repeat_interleave(begin - complete_cumsum(sizes)[:-1], sizes)
    return (run_start + torch.arange(total, device=offsets.device)).long()


def permute_2d_sparse(
    permute: torch.Tensor,
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Reorder the keys of a key-major jagged batch (``lengths`` is (K, B)).

    Row ``i`` of the result is row ``permute[i]`` of ``lengths``, with its values and weights.
    ``permute`` may repeat or omit keys.

    Args:
        permute: 1-D key order (any integer dtype; FBGEMM wants int32 on CPU, converted here).
        lengths: (K, B) lengths.
        values: 1-D values, ``lengths.sum()`` of them, key-major.
        weights: optional 1-D weights beside values.

    Returns:
        (permuted lengths (K', B), permuted values, permuted weights or None).
    """
    if use_fbgemm_ops() and values.device.type == "cpu":
        return torch.ops.fbgemm.permute_2D_sparse_data(
            permute.to(torch.int32), lengths, values, weights, None
        )
    permute = permute.to(device=lengths.device, dtype=torch.long)
    per_key = lengths.sum(dim=1)
    key_offsets = complete_cumsum(per_key)
    index = segment_ranges(key_offsets, permute, permute + 1)
    out_weights = weights[index] if weights is not None else None
    return lengths[permute], values[index], out_weights


def permute_1d_sparse(
    permute: torch.Tensor,
    lengths: torch.Tensor,
    values: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Reorder bags: bag ``i`` of the result is bag ``permute[i]`` (lengths are 1-D).

    Used for variable-batch layouts where keys have different numbers of bags.
    """
    if use_fbgemm_ops() and values.device.type == "cpu":
        return torch.ops.fbgemm.permute_1D_sparse_data(
            permute.to(torch.int32), lengths, values, weights, None
        )
    permute = permute.to(device=lengths.device, dtype=torch.long)
    offsets = complete_cumsum(lengths)
    index = segment_ranges(offsets, permute, permute + 1)
    out_weights = weights[index] if weights is not None else None
    return lengths[permute], values[index], out_weights
