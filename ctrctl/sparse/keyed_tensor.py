"""KeyedTensor: pooled embeddings of several features side by side in one dense tensor.

An EmbeddingBagCollection returns one of these: for a batch of B samples and features
``f1`` (dim 4) and ``f2`` (dim 8), ``values`` is (B, 12), columns 0..3 are ``f1`` and
4..11 are ``f2``::

    keys            = ["f1", "f2"]
    length_per_key  = [4, 8]
    values (B, 12)  = | f1: 4 columns | f2: 8 columns |

Example:
    >>> kt = KeyedTensor(["f1", "f2"], [4, 8], torch.randn(3, 12))
    >>> kt["f2"].shape          # torch.Size([3, 8])
    >>> kt.to_dict().keys()     # dict_keys(['f1', 'f2'])
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from ctrctl.errors import SparseInputError


class KeyedTensor:
    """Dense per-key blocks concatenated along ``key_dim``.

    Args:
        keys: one name per block.
        length_per_key: the size of each block along ``key_dim``.
        values: the concatenated tensor.
        key_dim: the dimension the blocks are concatenated along (1 for (B, sum of dims)).
    """

    def __init__(
        self,
        keys: Sequence[str],
        length_per_key: Sequence[int],
        values: torch.Tensor,
        key_dim: int = 1,
    ) -> None:
        self._keys = list(keys)
        self._length_per_key = [int(n) for n in length_per_key]
        if len(self._keys) != len(self._length_per_key):
            raise SparseInputError(
                f"{len(self._keys)} keys but {len(self._length_per_key)} lengths",
                where="KeyedTensor",
                hint="give one length per key",
            )
        if values.dim() <= key_dim or values.size(key_dim) != sum(self._length_per_key):
            raise SparseInputError(
                f"values of shape {tuple(values.shape)} do not have "
                f"{sum(self._length_per_key)} entries along dim {key_dim}",
                where="KeyedTensor",
                hint="length_per_key must add up to values.size(key_dim)",
            )
        self._values = values
        self._key_dim = key_dim
        self._offset_per_key: list[int] | None = None
        self._index_per_key: dict[str, int] | None = None

    @staticmethod
    def from_tensor_list(
        keys: Sequence[str], tensors: Sequence[torch.Tensor], key_dim: int = 1
    ) -> KeyedTensor:
        """Concatenate ``tensors`` (one per key) along ``key_dim``."""
        lengths = [t.size(key_dim) for t in tensors]
        return KeyedTensor(keys, lengths, torch.cat(list(tensors), dim=key_dim), key_dim)

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def key_dim(self) -> int:
        return self._key_dim

    def length_per_key(self) -> list[int]:
        return self._length_per_key

    def offset_per_key(self) -> list[int]:
        if self._offset_per_key is None:
            self._offset_per_key = [0, *itertools.accumulate(self._length_per_key)]
        return self._offset_per_key

    def _key_index(self, key: str) -> int:
        if self._index_per_key is None:
            self._index_per_key = {k: i for i, k in enumerate(self._keys)}
        if key not in self._index_per_key:
            raise SparseInputError(
                f"no key {key!r}", where="KeyedTensor", hint=f"keys are {self._keys}"
            )
        return self._index_per_key[key]

    def __getitem__(self, key: str) -> torch.Tensor:
        i = self._key_index(key)
        start = self.offset_per_key()[i]
        return self._values.narrow(self._key_dim, start, self._length_per_key[i])

    def to_dict(self) -> dict[str, torch.Tensor]:
        """One tensor (a view) per key."""
        parts = torch.split(self._values, self._length_per_key, dim=self._key_dim)
        return dict(zip(self._keys, parts, strict=True))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> KeyedTensor:
        return KeyedTensor(
            self._keys,
            self._length_per_key,
            self._values.to(device, non_blocking=non_blocking),
            self._key_dim,
        )

    @staticmethod
    def regroup(
        keyed_tensors: Sequence[KeyedTensor], groups: Sequence[Sequence[str]]
    ) -> list[torch.Tensor]:
        """Gather keys from several KeyedTensors into one tensor per group (along dim 1).

        Example:
            >>> KeyedTensor.regroup([kt_a, kt_b], [["f1", "g2"], ["f2"]])
        """
        blocks: dict[str, torch.Tensor] = {}
        for kt in keyed_tensors:
            blocks.update(kt.to_dict())
        out = []
        for group in groups:
            missing = [k for k in group if k not in blocks]
            if missing:
                raise SparseInputError(
                    f"keys {missing} are in no KeyedTensor",
                    where="KeyedTensor.regroup",
                    hint=f"available keys are {sorted(blocks)}",
                )
            out.append(torch.cat([blocks[k] for k in group], dim=keyed_tensors[0].key_dim()))
        return out

    def __repr__(self) -> str:
        return (
            f"KeyedTensor(keys={self._keys}, length_per_key={self._length_per_key}, "
            f"values={tuple(self._values.shape)})"
        )
