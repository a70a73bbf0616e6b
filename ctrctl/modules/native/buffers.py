"""Memory that a training step hands out again next step, instead of fresh memory each time.

A large tensor is freed back to the operating system (glibc serves allocations over 32 MB,
and others once the heap's top is trimmed, with ``mmap``), so the next step's tensor of the
same size starts on untouched pages and pays a page fault per 4 KiB. On the virtual
machines this project is measured on that costs about 0.6 ms per MB: a 54 MB all-to-all
buffer took 57 ms fresh against 23 ms reused. Kernels and collectives that make a large
tensor every step keep one :class:`ReusableBuffer` per call site and ask it for memory.

A buffer is handed out again only when nothing holds the previous tensor any more (no
view, no autograd saved tensor, no other thread): its storage's use count says so.
Otherwise new memory is allocated, so reuse never changes a result. Buffers of 8 MiB and
more are advised onto transparent huge pages (:func:`advise_huge_pages`) when allocated.

Example:
    >>> buffer = ReusableBuffer()
    >>> a = buffer.get((4096, 1664))      # new memory
    >>> del a
    >>> b = buffer.get((4096, 1664))      # the same memory, uninitialised
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import sys
from collections.abc import Sequence

import torch

# The storage's use count (the owner and the temporary storage object asked for it count
# 2 when nothing else holds it); without it (other torch builds) memory is never reused.
_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)

#: Buffers at least this large go on transparent huge pages (several 2 MiB pages' worth).
HUGE_PAGE_MIN_BYTES = 8 << 20
_HUGE = 1 << 21
_MADV_HUGEPAGE, _MADV_COLLAPSE = 14, 25  # Linux's values (asm-generic/mman-common.h)
_madvise = None
if sys.platform.startswith("linux"):
    try:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _madvise = _libc.madvise
        _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _madvise.restype = ctypes.c_int
    except (OSError, AttributeError):
        _madvise = None


def advise_huge_pages(tensor: torch.Tensor, collapse: bool = False) -> bool:
    """Back the 2 MiB-aligned inside of a CPU tensor's memory with transparent huge pages.

    Memory not touched yet gets huge pages as it is first written; with ``collapse``, pages
    already touched are moved into huge ones now (``MADV_COLLAPSE``, Linux 6.1+, about
    1.4 s per GiB here; elsewhere the kernel's khugepaged does it in the background). Rows
    read at random from tables and gradients far larger than the TLB's reach then cost no
    page walk each (measured on 26 x 100k x 64: the lookup 15-19% faster, the update 5-9%).
    False (and nothing done) off Linux, off the CPU, for small tensors, or where the
    system refuses (``transparent_hugepage`` set to ``never``); values are never changed.
    """
    nbytes = tensor.numel() * tensor.element_size()
    if _madvise is None or tensor.device.type != "cpu" or nbytes < HUGE_PAGE_MIN_BYTES:
        return False
    address = tensor.data_ptr()
    start = (address + _HUGE - 1) & ~(_HUGE - 1)
    end = (address + nbytes) & ~(_HUGE - 1)
    if end <= start or _madvise(start, end - start, _MADV_HUGEPAGE) != 0:
        return False
    if collapse:
        _madvise(start, end - start, _MADV_COLLAPSE)  # best effort: a failure changes nothing
    return True


class ReusableBuffer:
    """Uninitialised tensors in the memory of the previous one when that is free.

    Args:
        device: where the memory lives (reuse matters on the CPU; elsewhere it is harmless).
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device or "cpu")
        self._owner: torch.Tensor | None = None

    def get(self, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """An uninitialised contiguous tensor of ``shape``: the previous memory when nothing
        holds a tensor of it any more and it is large enough, new memory otherwise."""
        numel = math.prod(shape)
        owner = self._owner
        if (
            owner is None
            or owner.dtype != dtype
            or owner.numel() < numel
            or _storage_use_count is None
            or _storage_use_count(owner.untyped_storage()._cdata) > 2
        ):
            owner = torch.empty(numel, dtype=dtype, device=self.device)
            advise_huge_pages(owner)  # untouched yet: huge pages as it is first written
            self._owner = owner
        stride = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            stride[i] = stride[i + 1] * shape[i + 1]
        # ``set_`` (an alias of the storage, not a view) keeps the owner out of autograd.
        return torch.empty(0, dtype=dtype, device=self.device).set_(
            owner.untyped_storage(), 0, tuple(shape), tuple(stride))


def reusable_empty(buffer: ReusableBuffer | None, shape: Sequence[int],
                   like: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor of ``shape`` and ``like``'s dtype: from ``buffer`` on the CPU
    (where fresh memory costs page faults), new memory without a buffer or elsewhere."""
    if buffer is None or like.device.type != "cpu":
        return like.new_empty(tuple(shape))
    return buffer.get(shape, like.dtype)
