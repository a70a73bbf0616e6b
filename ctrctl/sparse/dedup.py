"""Deduplicated bags: each feature keeps its distinct bags once, with ``inverse_indices``.

A *bag* is one sample's id list for one feature. In a click log a user feature repeats over
that user's impressions, and Zipf-hot ids repeat everywhere, so many bags of a batch are equal.
:func:`deduplicate` keeps each feature's distinct bags (a variable batch per feature: the KJT's
``stride_per_key_per_rank``) and the map from every sample back to its bag
(``inverse_indices``), so that lookups and the input distribution handle each bag once and
:func:`expand` puts the pooled rows back in batch order.

For a batch of 4 samples and features ``user`` (4 bags, 2 distinct) and ``item`` (4 distinct)::

    lengths  user: [1, 1, 1, 1]   item: [1, 1, 1, 1]      values user: 7 7 9 7 | item: 3 4 5 6
    ->       user: [1, 1]         item: [1, 1, 1, 1]      values user: 7 9     | item: 3 4 5 6
    stride_per_key_per_rank [[2], [4]]
    inverse_indices (["user", "item"], [[0, 0, 1, 0], [0, 1, 2, 3]])   # (keys, B)

Bags are equal when their lengths, ids in order and (for weighted features) weights are
equal. Distinct bags come sorted (``torch.unique``), so the result is deterministic.

Example:
    >>> d = deduplicate(kjt)
    >>> d.stride_per_key(), distinct_share(d)           # ([2, 4], 0.75)
    >>> pooled_user = expand(pooled_unique_user, d.inverse_indices()[1][0])   # (B, D)
"""

from __future__ import annotations

import torch

from ctrctl.errors import SparseInputError
from ctrctl.sparse.jagged_tensor import KeyedJaggedTensor
from ctrctl.sparse.ops import complete_cumsum, segment_ranges


def unique_bags(
    lengths: torch.Tensor, values: torch.Tensor, weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """One feature's distinct bags.

    Args:
        lengths: (B,) bag lengths.
        values: their ids, bag after bag.
        weights: optional per-id weights (part of a bag's identity).

    Returns:
        (lengths (U,), ids, weights, inverse (B,)): the distinct bags in sorted order and, per
        sample, the index of its bag among them (``U <= B``).
    """
    batch = lengths.numel()
    if batch == 0:
        return lengths, values, weights, torch.zeros(0, dtype=torch.long, device=lengths.device)
    max_len = int(lengths.max())
    if max_len == 1 and bool((lengths == 1).all()) and weights is None:
        # one id per bag (the common case): the ids themselves are the bags
        u_values, inverse = torch.unique(values, return_inverse=True)
        return lengths.new_ones(u_values.numel()), u_values, None, inverse
    # (B, 1 + L [+ L]) rows: the length, the ids padded, the weights' bits padded
    width = 1 + max_len * (2 if weights is not None else 1)
    rows = torch.zeros(batch, width, dtype=torch.long, device=lengths.device)
    rows[:, 0] = lengths
    bag = torch.repeat_interleave(torch.arange(batch, device=lengths.device), lengths)
    pos = torch.arange(values.numel(), device=lengths.device) - complete_cumsum(lengths)[bag]
    rows[bag, 1 + pos] = values.long()
    if weights is not None:
        bits = weights.float().view(torch.int32).long()      # exact identity of each weight
        rows[bag, 1 + max_len + pos] = bits
    distinct, inverse = torch.unique(rows, dim=0, return_inverse=True)
    u_lengths = distinct[:, 0].to(lengths.dtype)
    keep = torch.arange(max_len, device=lengths.device)[None, :] < distinct[:, :1]  # (U, L)
    u_values = distinct[:, 1:1 + max_len][keep].to(values.dtype)
    u_weights = None
    if weights is not None:
        u_bits = distinct[:, 1 + max_len:][keep].to(torch.int32)
        u_weights = u_bits.view(torch.float32).to(weights.dtype)
    return u_lengths, u_values, u_weights, inverse


def deduplicate(kjt: KeyedJaggedTensor, keep_above: float = 1.0) -> KeyedJaggedTensor:
    """A KJT of one batch -> the same bags, each feature's distinct ones once.

    Args:
        kjt: a plain batch (one stride for every key).
        keep_above: a feature whose distinct bags are at least this share of its bags keeps
            every bag in batch order (inverse ``0 .. B-1``): too few repeats to pay for the
            expansion. 1.0: every feature is deduplicated.

    Returns a variable-batch KJT: key ``k`` holds ``stride_per_key()[k]`` bags (one source
    rank: ``stride_per_key_per_rank`` is ``[[U_k]]``), and ``inverse_indices()`` is
    ``(keys, (K, B))`` with ``[k, b]`` the bag of sample ``b`` among key ``k``'s.
    """
    if kjt.variable_stride_per_key():
        raise SparseInputError("the KJT already has a variable batch per key",
                               where="deduplicate", hint="deduplicate a plain batch once")
    keys = kjt.keys()
    batch = kjt.stride()
    lengths = kjt.lengths().view(len(keys), batch)
    if keys and batch and kjt.weights_or_none() is None and bool((lengths == 1).all()):
        return _deduplicate_single_ids(kjt, keep_above)
    per_key = kjt.length_per_key()
    values = kjt.values().split(per_key)
    weights = kjt.weights_or_none()
    weights_k = weights.split(per_key) if weights is not None else None
    out_len, out_val, out_wt, inverse, strides = [], [], [], [], []
    for k in range(len(keys)):
        wts = weights_k[k] if weights_k is not None else None
        u_len, u_val, u_wt, inv = unique_bags(lengths[k], values[k], wts)
        if batch and u_len.numel() >= keep_above * batch:
            u_len, u_val, u_wt = lengths[k], values[k], wts
            inv = torch.arange(batch, device=inv.device)
        out_len.append(u_len)
        out_val.append(u_val)
        if u_wt is not None:
            out_wt.append(u_wt)
        inverse.append(inv)
        strides.append([u_len.numel()])
    empty_inverse = torch.zeros(0, batch, dtype=torch.long)
    return KeyedJaggedTensor(
        keys,
        torch.cat(out_val) if out_val else kjt.values(),
        weights=torch.cat(out_wt) if weights is not None else None,
        lengths=torch.cat(out_len) if out_len else kjt.lengths(),
        stride=batch,
        stride_per_key_per_rank=strides,
        inverse_indices=(list(keys), torch.stack(inverse) if inverse else empty_inverse),
        length_per_key=[int(v.numel()) for v in out_val],
    )


def _deduplicate_single_ids(kjt: KeyedJaggedTensor, keep_above: float) -> KeyedJaggedTensor:
    """:func:`deduplicate` of a batch with one id per bag: one sort of (key, id) pairs."""
    keys, batch = kjt.keys(), kjt.stride()
    values = kjt.values()
    key_of = torch.arange(len(keys), device=values.device).repeat_interleave(batch)
    span = int(values.max()) - int(values.min()) + 1
    pairs = key_of * span + (values.long() - int(values.min()))        # (K * B,) sort keys
    distinct, inverse = torch.unique(pairs, return_inverse=True)
    counts = torch.bincount(distinct // span, minlength=len(keys))     # distinct ids per key
    first = complete_cumsum(counts)
    u_values = (distinct % span + int(values.min())).to(values.dtype)
    per_key_inverse = inverse.view(len(keys), batch) - first[:-1].unsqueeze(1)
    u_counts, u_first = counts.tolist(), first.tolist()
    out_val, inverses, strides = [], [], []
    every = torch.arange(batch, device=values.device)
    for k in range(len(keys)):
        if u_counts[k] >= keep_above * batch:       # keeps every bag, in batch order
            out_val.append(values[k * batch:(k + 1) * batch])
            inverses.append(every)
            strides.append([batch])
        else:
            out_val.append(u_values[u_first[k]:u_first[k + 1]])
            inverses.append(per_key_inverse[k])
            strides.append([u_counts[k]])
    u_len = [v.numel() for v in out_val]
    return KeyedJaggedTensor(
        keys, torch.cat(out_val), lengths=kjt.lengths().new_ones(sum(u_len)), stride=batch,
        stride_per_key_per_rank=strides, inverse_indices=(list(keys), torch.stack(inverses)),
        length_per_key=u_len)


def restore(kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
    """The plain batch a :func:`deduplicate` result stands for (every sample's bags again)."""
    keys, inverse = kjt.inverse_indices()
    if list(keys) != kjt.keys():
        raise SparseInputError(f"inverse_indices name {keys}, the KJT holds {kjt.keys()}",
                               where="restore", hint="keep inverse_indices with their keys")
    strides = kjt.stride_per_key()
    first = torch.tensor([0, *strides], device=inverse.device).cumsum(0)[:-1]
    bags = (inverse + first.unsqueeze(1)).reshape(-1)              # (K * B,) into all bags
    lengths = kjt.lengths()
    value_index = segment_ranges(complete_cumsum(lengths.long()), bags, bags + 1)
    weights = kjt.weights_or_none()
    return KeyedJaggedTensor(
        kjt.keys(), kjt.values()[value_index],
        weights=weights[value_index] if weights is not None else None,
        lengths=lengths[bags], stride=inverse.shape[1])


def distinct_share(kjt: KeyedJaggedTensor) -> float:
    """Distinct bags over all bags of a :func:`deduplicate` result (1.0: nothing repeats)."""
    _, inverse = kjt.inverse_indices()
    total = inverse.numel()
    return sum(kjt.stride_per_key()) / total if total else 1.0


def expand(pooled: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """(U, D) rows of distinct bags -> (B, D) in batch order. Backward sums each bag's
    gradient over the samples that share it, so the lookup sees it once."""
    return pooled.index_select(0, inverse)
