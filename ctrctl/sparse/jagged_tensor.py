"""JaggedTensor and KeyedJaggedTensor: variable-length id lists, as TorchRec lays them out.

A batch of B samples with K sparse features is one flat ``values`` tensor of ids plus
``lengths`` (how many ids each (key, sample) bag holds), **key-major**: all B lengths of key 0,
then all B lengths of key 1, and so on. ``offsets`` has one more entry than ``lengths``.
For keys ``f1``, ``f2`` and a batch of 3::

                 sample 0   sample 1   sample 2
    f1           [7, 2]     []         [5]
    f2           [1]        [4, 4, 9]  [3]

    keys    = ["f1", "f2"]
    values  = [7, 2, 5,  1, 4, 4, 9, 3]
    lengths = [2, 0, 1,  1, 3, 1]                 # (K * B,), key-major
    offsets = [0, 2, 2, 3, 4, 7, 8]               # (K * B + 1,)
    length_per_key = [3, 5]    offset_per_key = [0, 3, 8]    stride = 3

Optional ``weights`` (one float per value) ride beside ``values`` (weighted pooling).
A variable batch per key (``stride_per_key_per_rank``: each key may hold a different number of
bags, per source rank) is carried by the type; ``inverse_indices`` maps deduplicated bags back
to the batch. Construction does cheap shape checks only;
:func:`ctrctl.sparse.validation.validate_keyed_jagged` checks every value (a few vectorised
passes, no per-value Python).

Example:
    >>> kjt = KeyedJaggedTensor.from_lengths_sync(
    ...     keys=["f1", "f2"],
    ...     values=torch.tensor([7, 2, 5, 1, 4, 4, 9, 3]),
    ...     lengths=torch.tensor([2, 0, 1, 1, 3, 1]),
    ... )
    >>> kjt["f2"].to_dense()      # [tensor([1]), tensor([4, 4, 9]), tensor([3])]
    >>> validate_keyed_jagged(kjt, {"f1": 10, "f2": 10})
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

import torch

from ctrctl.errors import SparseInputError
from ctrctl.sparse.ops import complete_cumsum, permute_1d_sparse, permute_2d_sparse, segment_ranges

_INDEX_DTYPES = (torch.int32, torch.int64)


def _check_index_tensor(name: str, t: torch.Tensor, where: str) -> None:
    if t.dim() != 1:
        raise SparseInputError(
            f"{name} must be 1-D, got shape {tuple(t.shape)}", where=where, hint="flatten it"
        )
    if t.dtype not in _INDEX_DTYPES:
        raise SparseInputError(
            f"{name} must be int32 or int64, got {t.dtype}", where=where, hint=f"{name}.long()"
        )


class JaggedTensor:
    """One feature's bags: ``values`` split into rows by ``lengths`` (or ``offsets``).

    Args:
        values: 1-D values of all bags, in order.
        weights: optional per-value weights, same shape as values.
        lengths: one length per bag; give this or ``offsets``.
        offsets: bag boundaries, one more entry than bags.

    Example:
        >>> jt = JaggedTensor(values=torch.tensor([1, 4, 4, 9]), lengths=torch.tensor([1, 3]))
        >>> jt.offsets()      # tensor([0, 1, 4])
    """

    def __init__(
        self,
        values: torch.Tensor,
        weights: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
    ) -> None:
        if lengths is None and offsets is None:
            raise SparseInputError(
                "neither lengths nor offsets given", where="JaggedTensor", hint="pass one"
            )
        if lengths is not None:
            _check_index_tensor("lengths", lengths, "JaggedTensor")
        if offsets is not None:
            _check_index_tensor("offsets", offsets, "JaggedTensor")
        if weights is not None and weights.shape != values.shape:
            raise SparseInputError(
                f"weights {tuple(weights.shape)} and values {tuple(values.shape)} differ in shape",
                where="JaggedTensor",
                hint="give one weight per value",
            )
        self._values = values
        self._weights = weights
        self._lengths = lengths
        self._offsets = offsets

    @staticmethod
    def from_dense(
        values: Sequence[torch.Tensor], weights: Sequence[torch.Tensor] | None = None
    ) -> JaggedTensor:
        """Build from a list of 1-D tensors, one per bag."""
        lengths = torch.tensor([v.numel() for v in values], dtype=torch.long)
        flat = torch.cat(list(values)) if values else torch.zeros(0, dtype=torch.long)
        flat_w = torch.cat(list(weights)) if weights is not None and weights else None
        return JaggedTensor(flat, flat_w, lengths=lengths)

    def values(self) -> torch.Tensor:
        return self._values

    def weights(self) -> torch.Tensor:
        if self._weights is None:
            raise SparseInputError("this JaggedTensor has no weights", where="JaggedTensor")
        return self._weights

    def weights_or_none(self) -> torch.Tensor | None:
        return self._weights

    def lengths(self) -> torch.Tensor:
        if self._lengths is None:
            assert self._offsets is not None
            self._lengths = self._offsets[1:] - self._offsets[:-1]
        return self._lengths

    def offsets(self) -> torch.Tensor:
        if self._offsets is None:
            self._offsets = complete_cumsum(self.lengths())
        return self._offsets

    def to_dense(self) -> list[torch.Tensor]:
        """One 1-D tensor per bag (views into values)."""
        return list(torch.split(self._values, self.lengths().tolist()))

    def to_dense_weights(self) -> list[torch.Tensor] | None:
        if self._weights is None:
            return None
        return list(torch.split(self._weights, self.lengths().tolist()))

    def to_padded_dense(
        self, desired_length: int | None = None, padding_value: int = 0
    ) -> torch.Tensor:
        """(bags, desired_length) with each bag left-aligned and padded (or truncated)."""
        bags = self.to_dense()
        width = (
            desired_length
            if desired_length is not None
            else max((b.numel() for b in bags), default=0)
        )
        out = torch.full((len(bags), width), padding_value, dtype=self._values.dtype)
        for i, bag in enumerate(bags):
            n = min(width, bag.numel())
            out[i, :n] = bag[:n]
        return out

    def to(self, device: torch.device | str, non_blocking: bool = False) -> JaggedTensor:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        values = self._values.to(device, non_blocking=non_blocking)
        return JaggedTensor(values, move(self._weights), move(self._lengths), move(self._offsets))

    def __repr__(self) -> str:
        return f"JaggedTensor(values={self._values}, lengths={self.lengths()})"


class KeyedJaggedTensor:
    """Several features' bags in one key-major jagged layout (see the module docstring).

    Args:
        keys: feature names, in layout order.
        values: 1-D ids (int64 usually), key-major.
        weights: optional 1-D float per value (weighted pooling).
        lengths: (sum of strides,) bag lengths; give this or ``offsets``.
        offsets: bag boundaries, one more entry than lengths.
        stride: batch size (bags per key); inferred from lengths when omitted.
        stride_per_key_per_rank: variable batch: for each key, the bag count from each rank.
        inverse_indices: variable batch: (keys, (K, B) tensor) mapping each key's bags back to
            the batch positions.
        length_per_key, offset_per_key: caches a caller may already know (values per key).

    Example:
        >>> kjt = KeyedJaggedTensor(["a", "b"], torch.tensor([1, 2, 3]),
        ...                         lengths=torch.tensor([1, 0, 1, 1]))
        >>> kjt.stride(), kjt.length_per_key()      # (2, [1, 2])
    """

    def __init__(
        self,
        keys: Sequence[str],
        values: torch.Tensor,
        weights: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
        stride: int | None = None,
        stride_per_key_per_rank: Sequence[Sequence[int]] | None = None,
        inverse_indices: tuple[list[str], torch.Tensor] | None = None,
        length_per_key: Sequence[int] | None = None,
        offset_per_key: Sequence[int] | None = None,
    ) -> None:
        where = "KeyedJaggedTensor"
        self._keys = list(keys)
        if values.dim() != 1:
            raise SparseInputError(
                f"values must be 1-D, got shape {tuple(values.shape)}", where=where, hint="flatten"
            )
        if lengths is None and offsets is None:
            raise SparseInputError(
                "neither lengths nor offsets given", where=where, hint="pass one"
            )
        if lengths is not None:
            _check_index_tensor("lengths", lengths, where)
        if offsets is not None:
            _check_index_tensor("offsets", offsets, where)
        if weights is not None and weights.shape != values.shape:
            raise SparseInputError(
                f"weights {tuple(weights.shape)} and values {tuple(values.shape)} differ in shape",
                where=where,
                hint="give one weight per value",
            )
        num_bags = lengths.numel() if lengths is not None else offsets.numel() - 1  # type: ignore[union-attr]
        if lengths is not None and offsets is not None and offsets.numel() != lengths.numel() + 1:
            raise SparseInputError(
                f"offsets has {offsets.numel()} entries but lengths has {lengths.numel()}",
                where=where,
                hint="offsets needs exactly one more entry than lengths",
            )
        self._stride_per_key_per_rank: list[list[int]] | None = None
        if stride_per_key_per_rank is not None:
            spkpr = [[int(s) for s in per_rank] for per_rank in stride_per_key_per_rank]
            if len(spkpr) != len(self._keys):
                raise SparseInputError(
                    f"stride_per_key_per_rank has {len(spkpr)} entries for {len(self._keys)} keys",
                    where=where,
                    hint="give one list of per-rank strides per key",
                )
            if sum(sum(s) for s in spkpr) != num_bags:
                raise SparseInputError(
                    f"stride_per_key_per_rank adds up to {sum(sum(s) for s in spkpr)} bags "
                    f"but lengths has {num_bags}",
                    where=where,
                )
            self._stride_per_key_per_rank = spkpr
            stride = max((sum(s) for s in spkpr), default=0) if stride is None else stride
        elif stride is None:
            if self._keys:
                stride = num_bags // len(self._keys)
            else:
                stride = 0
        if self._stride_per_key_per_rank is None and stride * len(self._keys) != num_bags:
            raise SparseInputError(
                f"{num_bags} bags do not split into {len(self._keys)} keys x batch {stride}",
                where=where,
                hint="lengths must hold one entry per (key, sample), key-major",
            )
        self._values = values
        self._weights = weights
        self._lengths = lengths
        self._offsets = offsets
        self._stride = int(stride)
        self._inverse_indices = inverse_indices
        self._length_per_key = list(length_per_key) if length_per_key is not None else None
        self._offset_per_key = list(offset_per_key) if offset_per_key is not None else None
        self._index_per_key: dict[str, int] | None = None

    # ---- construction -------------------------------------------------------------------

    @staticmethod
    def from_lengths_sync(
        keys: Sequence[str],
        values: torch.Tensor,
        lengths: torch.Tensor,
        weights: torch.Tensor | None = None,
        stride: int | None = None,
    ) -> KeyedJaggedTensor:
        """Build from lengths and compute the per-key value counts now (one device sync).

        Also checks that the lengths add up to the number of values.
        """
        kjt = KeyedJaggedTensor(keys, values, weights, lengths=lengths, stride=stride)
        kjt.sync()
        return kjt

    @staticmethod
    def from_offsets_sync(
        keys: Sequence[str],
        values: torch.Tensor,
        offsets: torch.Tensor,
        weights: torch.Tensor | None = None,
        stride: int | None = None,
    ) -> KeyedJaggedTensor:
        """Build from offsets and compute the per-key value counts now (one device sync)."""
        kjt = KeyedJaggedTensor(keys, values, weights, offsets=offsets, stride=stride)
        kjt.sync()
        return kjt

    @staticmethod
    def from_jt_dict(jt_dict: Mapping[str, JaggedTensor]) -> KeyedJaggedTensor:
        """Concatenate one JaggedTensor per key (all with the same number of bags)."""
        keys = list(jt_dict)
        jts = [jt_dict[k] for k in keys]
        has_weights = [jt.weights_or_none() is not None for jt in jts]
        if any(has_weights) and not all(has_weights):
            raise SparseInputError(
                "some keys have weights and others do not", where="KeyedJaggedTensor.from_jt_dict"
            )
        weights = torch.cat([jt.weights() for jt in jts]) if jts and all(has_weights) else None
        values = torch.cat([jt.values() for jt in jts]) if jts else torch.zeros(0, dtype=torch.long)
        lengths = (
            torch.cat([jt.lengths() for jt in jts]) if jts else torch.zeros(0, dtype=torch.long)
        )
        return KeyedJaggedTensor.from_lengths_sync(keys, values, lengths, weights)

    @staticmethod
    def empty(
        keys: Sequence[str] = (), stride: int = 0, device: torch.device | str = "cpu"
    ) -> KeyedJaggedTensor:
        """No values: every bag of every key is empty."""
        lengths = torch.zeros(len(keys) * stride, dtype=torch.long, device=device)
        values = torch.zeros(0, dtype=torch.long, device=device)
        return KeyedJaggedTensor(keys, values, lengths=lengths, stride=stride)

    def sync(self) -> KeyedJaggedTensor:
        """Compute length_per_key / offset_per_key now; check the lengths add up to values."""
        self._length_per_key = None
        self._offset_per_key = None
        total = self.offset_per_key()[-1]
        if total != self._values.numel():
            raise SparseInputError(
                f"lengths add up to {total} values but values has {self._values.numel()}",
                where="KeyedJaggedTensor",
                hint="each id belongs to exactly one (key, sample) bag; check the lengths",
            )
        return self

    # ---- accessors ----------------------------------------------------------------------

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def weights(self) -> torch.Tensor:
        if self._weights is None:
            raise SparseInputError(
                "this KeyedJaggedTensor has no weights", where="KeyedJaggedTensor"
            )
        return self._weights

    def weights_or_none(self) -> torch.Tensor | None:
        return self._weights

    def lengths(self) -> torch.Tensor:
        if self._lengths is None:
            assert self._offsets is not None
            self._lengths = self._offsets[1:] - self._offsets[:-1]
        return self._lengths

    def lengths_or_none(self) -> torch.Tensor | None:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        if self._offsets is None:
            self._offsets = complete_cumsum(self.lengths())
        return self._offsets

    def offsets_or_none(self) -> torch.Tensor | None:
        return self._offsets

    def stride(self) -> int:
        return self._stride

    def variable_stride_per_key(self) -> bool:
        return self._stride_per_key_per_rank is not None

    def stride_per_key_per_rank(self) -> list[list[int]]:
        if self._stride_per_key_per_rank is None:
            return [[self._stride] for _ in self._keys]
        return self._stride_per_key_per_rank

    def stride_per_key(self) -> list[int]:
        if self._stride_per_key_per_rank is None:
            return [self._stride] * len(self._keys)
        return [sum(s) for s in self._stride_per_key_per_rank]

    def inverse_indices(self) -> tuple[list[str], torch.Tensor]:
        if self._inverse_indices is None:
            raise SparseInputError(
                "this KeyedJaggedTensor has no inverse indices", where="KeyedJaggedTensor"
            )
        return self._inverse_indices

    def inverse_indices_or_none(self) -> tuple[list[str], torch.Tensor] | None:
        return self._inverse_indices

    def _bag_offset_per_key(self) -> list[int]:
        return [0, *itertools.accumulate(self.stride_per_key())]

    def length_per_key(self) -> list[int]:
        """Number of values of each key (one device sync the first time)."""
        if self._length_per_key is None:
            if self._stride_per_key_per_rank is None and self._lengths is not None:
                per_key = self._lengths.view(len(self._keys), self._stride).sum(dim=1)
                self._length_per_key = per_key.tolist() if self._keys else []
            else:
                bag_offsets = torch.tensor(self._bag_offset_per_key(), device=self._values.device)
                at = self.offsets()[bag_offsets]
                self._length_per_key = (at[1:] - at[:-1]).tolist()
        return self._length_per_key  # type: ignore[return-value]

    def offset_per_key(self) -> list[int]:
        if self._offset_per_key is None:
            self._offset_per_key = [0, *itertools.accumulate(self.length_per_key())]
        return self._offset_per_key

    def index_per_key(self) -> dict[str, int]:
        if self._index_per_key is None:
            self._index_per_key = {k: i for i, k in enumerate(self._keys)}
        return self._index_per_key

    # ---- views and transforms -----------------------------------------------------------

    def __getitem__(self, key: str) -> JaggedTensor:
        index = self.index_per_key().get(key)
        if index is None:
            raise SparseInputError(
                f"no key {key!r}", where="KeyedJaggedTensor", hint=f"keys are {self._keys}"
            )
        start, end = self.offset_per_key()[index], self.offset_per_key()[index + 1]
        bag_start, bag_end = self._bag_offset_per_key()[index : index + 2]
        weights = self._weights[start:end] if self._weights is not None else None
        return JaggedTensor(
            self._values[start:end], weights, lengths=self.lengths()[bag_start:bag_end]
        )

    def to_dict(self) -> dict[str, JaggedTensor]:
        """One JaggedTensor per key (values are views)."""
        return {key: self[key] for key in self._keys}

    def split(self, segments: Sequence[int]) -> list[KeyedJaggedTensor]:
        """Split into consecutive groups of keys: ``segments`` gives the number of keys per part.

        Example:
            >>> a, b = kjt.split([1, 1])     # a has keys[:1], b keys[1:2]
        """
        if sum(segments) != len(self._keys):
            raise SparseInputError(
                f"segments {list(segments)} add up to {sum(segments)} keys, not {len(self._keys)}",
                where="KeyedJaggedTensor.split",
                hint="the segments must cover every key exactly once",
            )
        opk = self.offset_per_key()
        bag_offsets = self._bag_offset_per_key()
        lengths = self.lengths()
        out = []
        key_start = 0
        for size in segments:
            key_end = key_start + size
            v0, v1 = opk[key_start], opk[key_end]
            b0, b1 = bag_offsets[key_start], bag_offsets[key_end]
            spkpr = (
                self._stride_per_key_per_rank[key_start:key_end]
                if self._stride_per_key_per_rank is not None
                else None
            )
            out.append(
                KeyedJaggedTensor(
                    keys=self._keys[key_start:key_end],
                    values=self._values[v0:v1],
                    weights=self._weights[v0:v1] if self._weights is not None else None,
                    lengths=lengths[b0:b1],
                    stride=self._stride,
                    stride_per_key_per_rank=spkpr,
                    inverse_indices=self._inverse_indices,
                    length_per_key=self.length_per_key()[key_start:key_end],
                )
            )
            key_start = key_end
        return out

    def permute(self, indices: Sequence[int]) -> KeyedJaggedTensor:
        """Reorder keys: key ``i`` of the result is key ``indices[i]`` (repeats allowed).

        Uses FBGEMM's ``permute_2D_sparse_data`` (``permute_1D_sparse_data`` for variable
        batch) where available, plain torch otherwise.
        """
        n = len(self._keys)
        for position, i in enumerate(indices):
            if not 0 <= i < n:
                raise SparseInputError(
                    f"permute index {i} at position {position} is not a key index in [0, {n})",
                    where="KeyedJaggedTensor.permute",
                )
        keys = [self._keys[i] for i in indices]
        length_per_key = self.length_per_key()
        permuted_lpk = [length_per_key[i] for i in indices]
        device = self._values.device
        perm = torch.tensor(list(indices), dtype=torch.int32, device=device)
        if self._stride_per_key_per_rank is None:
            lengths2d = self.lengths().view(n, self._stride)
            lengths, values, weights = permute_2d_sparse(
                perm, lengths2d, self._values, self._weights
            )
            lengths = lengths.reshape(-1)
            spkpr = None
        else:
            bag_offsets = torch.tensor(self._bag_offset_per_key(), device=device)
            perm_long = perm.long()
            bag_perm = segment_ranges(bag_offsets, perm_long, perm_long + 1)
            lengths, values, weights = permute_1d_sparse(
                bag_perm, self.lengths(), self._values, self._weights
            )
            spkpr = [self._stride_per_key_per_rank[i] for i in indices]
        return KeyedJaggedTensor(
            keys=keys,
            values=values,
            weights=weights,
            lengths=lengths,
            stride=self._stride,
            stride_per_key_per_rank=spkpr,
            inverse_indices=self._inverse_indices,
            length_per_key=permuted_lpk,
        )

    @staticmethod
    def concat(kjts: Sequence[KeyedJaggedTensor]) -> KeyedJaggedTensor:
        """Concatenate along keys (all parts have the same stride unless variable batch)."""
        if not kjts:
            raise SparseInputError("nothing to concatenate", where="KeyedJaggedTensor.concat")
        variable = any(k.variable_stride_per_key() for k in kjts)
        strides = {k.stride() for k in kjts}
        if not variable and len(strides) != 1:
            raise SparseInputError(
                f"parts have different batch sizes {sorted(strides)}",
                where="KeyedJaggedTensor.concat",
                hint="concatenate KJTs of one batch, or use stride_per_key_per_rank",
            )
        has_weights = [k.weights_or_none() is not None for k in kjts]
        if any(has_weights) and not all(has_weights):
            raise SparseInputError(
                "some parts have weights and others do not", where="KeyedJaggedTensor.concat"
            )
        keys = [key for k in kjts for key in k.keys()]
        spkpr = [s for k in kjts for s in k.stride_per_key_per_rank()] if variable else None
        return KeyedJaggedTensor(
            keys=keys,
            values=torch.cat([k.values() for k in kjts]),
            weights=torch.cat([k.weights() for k in kjts]) if all(has_weights) else None,
            lengths=torch.cat([k.lengths() for k in kjts]),
            stride=None if variable else kjts[0].stride(),
            stride_per_key_per_rank=spkpr,
            length_per_key=[n for k in kjts for n in k.length_per_key()],
        )

    def _map_tensors(
        self, fn: Callable[[torch.Tensor], torch.Tensor]
    ) -> KeyedJaggedTensor:
        """The same KJT with ``fn`` applied to every tensor (cached per-key counts kept)."""

        def apply(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else fn(t)

        inverse = None
        if self._inverse_indices is not None:
            inverse = (self._inverse_indices[0], fn(self._inverse_indices[1]))
        return KeyedJaggedTensor(
            keys=self._keys,
            values=fn(self._values),
            weights=apply(self._weights),
            lengths=apply(self._lengths),
            offsets=apply(self._offsets),
            stride=self._stride,
            stride_per_key_per_rank=self._stride_per_key_per_rank,
            inverse_indices=inverse,
            length_per_key=self._length_per_key,
            offset_per_key=self._offset_per_key,
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> KeyedJaggedTensor:
        """A copy on ``device`` (cached per-key counts are kept, no sync)."""
        return self._map_tensors(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> KeyedJaggedTensor:
        """A copy in page-locked memory (for asynchronous host-to-GPU copies)."""
        return self._map_tensors(lambda t: t.pin_memory())

    def record_stream(self, stream: torch.cuda.Stream) -> None:
        for t in (self._values, self._weights, self._lengths, self._offsets):
            if t is not None:
                t.record_stream(stream)

    def __repr__(self) -> str:
        return (
            f"KeyedJaggedTensor(keys={self._keys}, stride={self._stride}, "
            f"values={self._values.numel()}, weighted={self._weights is not None})"
        )
