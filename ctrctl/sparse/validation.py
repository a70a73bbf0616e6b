"""Full checks of a KeyedJaggedTensor: each error names the key, the sample and the value.

Construction checks shapes only (cheap); these checks read every length, offset and id, in
a few vectorised passes, and are run on purpose: on a loader's first batch, in tests, or
where ids come from outside.

Example:
    >>> validate_keyed_jagged(kjt, {"C1": 100_000})
    SparseInputError: KeyedJaggedTensor: key 'C1', sample 17, value 412: id 100523 is outside
    [0, 100000) (ids index a table's rows: ...)
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from ctrctl.errors import SparseInputError

if TYPE_CHECKING:
    from ctrctl.sparse.jagged_tensor import KeyedJaggedTensor

WHERE = "KeyedJaggedTensor"


def _locate_bag(kjt: KeyedJaggedTensor, bag: int) -> tuple[str, int]:
    """(key, sample) of flat bag number ``bag``."""
    bag_offsets = [0, *itertools.accumulate(kjt.stride_per_key())]
    for k, key in enumerate(kjt.keys()):
        if bag < bag_offsets[k + 1]:
            return key, bag - bag_offsets[k]
    return "?", bag


def _first(mask: torch.Tensor) -> int:
    return int(torch.nonzero(mask)[0])


def validate_keyed_jagged(
    kjt: KeyedJaggedTensor, num_embeddings: Mapping[str, int] | None = None
) -> None:
    """Raise :class:`SparseInputError` at the first malformed length, offset or id.

    Args:
        kjt: the batch to check.
        num_embeddings: table rows per key; ids of a listed key must be in [0, rows). Keys
            not in the mapping are only checked for negative ids.
    """
    _check(kjt, num_embeddings)
    # The cached per-key counts may predate the checks: recompute them from checked data.
    kjt.sync()


def _check(kjt: KeyedJaggedTensor, num_embeddings: Mapping[str, int] | None) -> None:
    offsets = kjt.offsets_or_none()
    given_lengths = kjt.lengths_or_none()
    if offsets is not None:
        if int(offsets[0]) != 0:
            raise SparseInputError(
                f"offsets start at {int(offsets[0])}, not 0",
                where=WHERE,
                hint="offsets[0] must be 0",
            )
        steps = offsets[1:] - offsets[:-1]
        if steps.numel() and bool((steps < 0).any()):
            bag = _first(steps < 0)
            key, sample = _locate_bag(kjt, bag)
            raise SparseInputError(
                f"key {key!r}, sample {sample}: offsets decrease from {int(offsets[bag])} "
                f"to {int(offsets[bag + 1])} at position {bag + 1}",
                where=WHERE,
                hint="offsets must be non-decreasing",
            )
        if given_lengths is not None and not torch.equal(steps, given_lengths.to(steps.dtype)):
            key, sample = _locate_bag(kjt, _first(steps != given_lengths.to(steps.dtype)))
            raise SparseInputError(
                f"key {key!r}, sample {sample}: lengths and offsets disagree", where=WHERE
            )
    lengths = kjt.lengths()
    if lengths.numel() and bool((lengths < 0).any()):
        bag = _first(lengths < 0)
        key, sample = _locate_bag(kjt, bag)
        raise SparseInputError(
            f"key {key!r}, sample {sample}: negative length {int(lengths[bag])}",
            where=WHERE,
            hint="lengths count the ids in each bag and cannot be negative",
        )
    values = kjt.values()
    total = int(lengths.sum()) if lengths.numel() else 0
    if total != values.numel():
        raise SparseInputError(
            f"lengths add up to {total} values but values has {values.numel()}",
            where=WHERE,
            hint="each id belongs to exactly one (key, sample) bag; check the lengths",
        )
    if values.numel() == 0:
        return
    bag_offsets = [0, *itertools.accumulate(kjt.stride_per_key())]
    full_offsets = kjt.offsets()
    value_bounds = full_offsets[torch.tensor(bag_offsets, device=full_offsets.device)].tolist()
    for k, key in enumerate(kjt.keys()):
        start, end = value_bounds[k], value_bounds[k + 1]
        ids = values[start:end]
        if ids.numel() == 0:
            continue
        limit = num_embeddings.get(key) if num_embeddings is not None else None
        bad = ids < 0
        if limit is not None:
            bad = bad | (ids >= limit)
        if bool(bad.any()):
            position = start + _first(bad)
            # The bag holding this value: the last bag of this key starting at or before it.
            key_offsets = full_offsets[bag_offsets[k] : bag_offsets[k + 1] + 1]
            sample = int((key_offsets[1:] <= position).sum())
            valid = f"[0, {limit})" if limit is not None else "[0, inf)"
            raise SparseInputError(
                f"key {key!r}, sample {sample}, value {position}: id {int(values[position])} is "
                f"outside {valid}",
                where=WHERE,
                hint="ids index a table's rows: hash or map them into the table's range "
                "at preprocessing",
            )
