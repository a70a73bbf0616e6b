"""Jagged tensors in TorchRec's layout: JaggedTensor, KeyedJaggedTensor, KeyedTensor.

Example:
    >>> from ctrctl.sparse import KeyedJaggedTensor
    >>> kjt = KeyedJaggedTensor.from_lengths_sync(["a"], torch.tensor([3, 1]), torch.tensor([2]))
"""

from ctrctl.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor
from ctrctl.sparse.keyed_tensor import KeyedTensor

__all__ = ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor"]
