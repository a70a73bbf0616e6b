"""Table-batched embedding bags on ctrctl's own C kernel (CPU), the optimizer fused into backward.

Storage, state and interface are the plain-torch kernel's (:mod:`ctrctl.modules.torch_embedding`:
one flat (rows, dim) fp32 weight per dim, optimizer state named as FBGEMM names it), so
checkpoints move freely between the two. What differs is the work per batch:

* forward: one C call pools every bag of every feature straight into the (B, sum of dims)
  output, on ``torch.get_num_threads()`` threads split by sample;
* backward: one C call computes a key per id (its table's first key + id), sorts the keys
  (stable radix sort; each feature's ids on their own and in parallel where no table has
  two features), sums the gradient of each distinct row over all the bags and features
  that read it, and updates that row once with the optimizer (no (ids, dim) gradient tensor,
  no index_add_/index_copy_ round trips). Hot rows of a skewed batch are read and written once.

Numerics: the C code rounds where the plain-torch reference rounds (no floating-point
contraction, except the fused multiply-add of the weighted forward, where torch's FBGEMM
kernel fuses too) and sums repeated ids in the ids' order as the reference's index_add_ does.
Measured bit-identical for exact SGD and exact Adagrad. Summation order differs in two
places: the row-wise mean of g * g (row-wise Adagrad) and the dot products of
per-sample-weight gradients are summed in 16 lanes, so those differ from torch's reductions
by float32 rounding (about one ulp).

The extension (``ctrctl/modules/native/_embedding_kernel.c``) is optional: where it was not built,
:func:`native_available` is False and ``backend="auto"`` takes another kernel.

Example:
    >>> tbe = NativeTableBatchedEmbeddingBags([(100, 8), (50, 8)],
    ...                                       optimizer=EmbeddingOptimizerConfig())
    >>> tbe(indices, offsets).shape           # (B, 16)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from ctrctl.errors import ConfigError, SparseInputError
from ctrctl.modules.embedding_kernel import batch_of
from ctrctl.modules.native.buffers import ReusableBuffer, advise_huge_pages
from ctrctl.modules.optimizers import EmbeddingOptimizerConfig
from ctrctl.modules.torch_embedding import TorchTableBatchedEmbeddingBags

try:
    from ctrctl.modules.native import _embedding_kernel as _ext  # type: ignore[attr-defined]
except ImportError:  # not built (no C compiler at install time)
    _ext = None

# Private, but stable since torch 1.x; without it every step gets a fresh output.
_KINDS = {"exact_sgd": 0, "exact_adagrad": 1, "exact_rowwise_adagrad": 2}
_WEIGHT_DECAY_MODES = {"none": 0, "l2": 1, "decoupled": 2}
#: Buffers up to this size are collapsed into huge pages on first use (about 1.4 s per GiB
#: here); larger ones are only advised.
COLLAPSE_MAX_BYTES = 2 << 30


def native_available() -> bool:
    """Whether the C extension was built and imports."""
    return _ext is not None


def native_isa() -> str | None:
    """The instruction sets the extension's loops are built for (None when not built)."""
    return str(_ext.isa()) if _ext is not None else None


def native_cannot_run(optimizer: EmbeddingOptimizerConfig, device: torch.device,
                      data_type: str = "fp32") -> str | None:
    """Why the native kernel cannot serve this optimizer on ``device`` (None when it can)."""
    if _ext is None:
        return "the native embedding kernel was not built"
    if device.type != "cpu":
        return f"the native embedding kernel runs on CPU only, not {device.type}"
    if optimizer.kind not in _KINDS:
        return f"the native embedding kernel does not run optimizer {optimizer.kind!r}"
    if data_type != "fp32":
        return f"the native embedding kernel stores fp32 only, not {data_type}"
    return None


class _NativeLookup(torch.autograd.Function):
    """Pooled lookup; backward updates the tables in place and returns no grad for them."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        trigger: torch.Tensor,
        kernel: NativeTableBatchedEmbeddingBags,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None,
    ) -> torch.Tensor:
        batch = (offsets.numel() - 1) // kernel.num_features
        meta = kernel._meta()
        out = kernel._output(batch)  # (B, sum of feature dims)
        psw = per_sample_weights
        bad = _ext.forward(
            kernel.num_features, batch, indices.data_ptr(), offsets.data_ptr(),
            psw.data_ptr() if psw is not None else 0,
            meta[0].data_ptr(), meta[2].data_ptr(), meta[3].data_ptr(), meta[4].data_ptr(),
            out.data_ptr(), kernel.total_dim, int(kernel.pooling == "mean"),
            torch.get_num_threads(),
        )
        if bad == -2:
            raise SparseInputError("offsets decrease", where="NativeTableBatchedEmbeddingBags",
                                   hint="offsets must be non-decreasing bag boundaries")
        if bad >= 0:
            raise SparseInputError(
                f"id {int(indices[bad])} at position {bad} is outside its table",
                where="NativeTableBatchedEmbeddingBags",
                hint="ids must lie in [0, num_embeddings) of the feature's table",
            )
        ctx.kernel = kernel
        ctx.batch = batch
        ctx.save_for_backward(indices, offsets, psw)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:  # (B, sum of dims)
        indices, offsets, psw = ctx.saved_tensors
        kernel: NativeTableBatchedEmbeddingBags = ctx.kernel
        grad = grad_out.contiguous().float()
        grad_psw = None
        if psw is not None and ctx.needs_input_grad[4]:
            grad_psw = torch.empty_like(psw)
        meta = kernel._meta()
        workspace = kernel._workspace(_ext.workspace_size(indices.numel()))
        cfg = kernel.optimizer
        _ext.backward(
            kernel.num_features, ctx.batch, indices.data_ptr(), offsets.data_ptr(),
            psw.data_ptr() if psw is not None else 0,
            meta[0].data_ptr(), meta[1].data_ptr(), meta[2].data_ptr(), meta[3].data_ptr(),
            meta[4].data_ptr(), meta[5].data_ptr(), grad.data_ptr(), grad.size(1),
            grad_psw.data_ptr() if grad_psw is not None else 0,
            kernel.total_rows, max(kernel.feature_dims), int(kernel.pooling == "mean"),
            _KINDS[cfg.kind], float(kernel.learning_rate), float(cfg.eps),
            float(cfg.weight_decay), _WEIGHT_DECAY_MODES[cfg.weight_decay_mode],
            torch.get_num_threads(), workspace.data_ptr(), workspace.numel(),
        )
        return None, None, None, None, grad_psw


class NativeTableBatchedEmbeddingBags(TorchTableBatchedEmbeddingBags):
    """Table-batched embedding bags on the native CPU kernel, optimizer fused into backward.

    Args:
        tables: (rows, dim) per table.
        feature_table_map: the table each feature looks up (default: feature i -> table i).
        optimizer: the fused optimizer: exact_sgd, exact_adagrad or exact_rowwise_adagrad
            (with weight decay "l2" or "decoupled").
        pooling: "sum" or "mean".
        device: must be CPU.

    Example:
        >>> tbe = NativeTableBatchedEmbeddingBags([(100, 8)], [0, 0])
        >>> tbe(torch.tensor([1, 2, 3]), torch.tensor([0, 1, 1, 3])).shape   # (1, 16)
    """

    def __init__(
        self,
        tables: Sequence[tuple[int, int]],
        feature_table_map: Sequence[int] | None = None,
        optimizer: EmbeddingOptimizerConfig | None = None,
        pooling: str = "sum",
        device: torch.device | str | None = None,
    ) -> None:
        device = torch.device(device or "cpu")
        reason = native_cannot_run(optimizer or EmbeddingOptimizerConfig(), device)
        if reason is not None:
            raise ConfigError(reason, where="NativeTableBatchedEmbeddingBags",
                              hint='use backend="torch" or "auto"')
        super().__init__(tables, feature_table_map, optimizer, pooling, device)
        self.num_features = len(self.feature_table_map)
        self.total_dim = sum(self.feature_dims)
        self.total_rows = sum(rows for rows, _ in self.tables)
        table_keys = [0, *itertools.accumulate(rows for rows, _ in self.tables)]
        self._keys = [table_keys[t] for t in self.feature_table_map]
        self._cols = [0, *itertools.accumulate(self.feature_dims)][:-1]
        self._meta_cache: tuple[tuple[int, ...], torch.Tensor] | None = None
        # Reused between steps: a fresh 27 MB output (26 x 64 floats x 4096) costs more in
        # page faults than the lookup itself.
        self._out = ReusableBuffer()
        self._scratch = torch.empty(0, dtype=torch.uint8)

    def _output(self, batch: int) -> torch.Tensor:
        """An uninitialised (batch, total_dim) output, in the previous step's memory when
        nothing holds that any more (:class:`~ctrctl.modules.native.buffers.ReusableBuffer`)."""
        return self._out.get((batch, self.total_dim))

    def _workspace(self, size: int) -> torch.Tensor:
        """Backward's scratch (keys, positions, sort buffers), kept between steps."""
        if self._scratch.numel() < size:
            self._scratch = torch.empty(size + size // 4, dtype=torch.uint8)
        return self._scratch

    def _advise_huge_pages(self) -> None:
        """Tables and their optimizer state on transparent huge pages
        (:func:`~ctrctl.modules.native.buffers.advise_huge_pages`: rows are read at random, and
        with 4 KiB pages nearly every one costs a TLB miss). Memory already touched is
        collapsed into huge pages at once for buffers up to :data:`COLLAPSE_MAX_BYTES`;
        larger ones are left to the kernel's background collapsing, so a first step never
        stalls on many GiB."""
        for tensor in [*self.flat_weights, *(s for state in self.states for s in state.values())]:
            nbytes = tensor.numel() * tensor.element_size()
            advise_huge_pages(tensor, collapse=nbytes <= COLLAPSE_MAX_BYTES)

    def _meta(self) -> torch.Tensor:
        """(6, F) int64: per feature its table's weight and state addresses, dim, rows,
        output column and first key; rebuilt when the buffers move."""
        addresses = tuple(w.data_ptr() for w in self.flat_weights) + tuple(
            s.data_ptr() for state in self.states for s in state.values()
        )
        if self._meta_cache is not None and self._meta_cache[0] == addresses:
            return self._meta_cache[1]
        self._advise_huge_pages()
        weights, states = [], []
        for t in self.feature_table_map:
            dim = self.tables[t][1]
            g, start = self._table_place(t)
            weight = self.flat_weights[g]
            if not weight.is_contiguous() or weight.dtype != torch.float32:
                raise ConfigError("the native kernel needs contiguous fp32 weights",
                                  where="NativeTableBatchedEmbeddingBags")
            weights.append(weight.data_ptr() + start * dim * weight.element_size())
            state = self.states[g].get("momentum1")
            if state is None:
                states.append(0)
            else:
                per_row = state[0].numel() if state.dim() > 1 else 1
                states.append(state.data_ptr() + start * per_row * state.element_size())
        meta = torch.tensor(
            [weights, states, self.feature_dims,
             [self.tables[t][0] for t in self.feature_table_map], self._cols, self._keys],
            dtype=torch.int64,
        )
        self._meta_cache = (addresses, meta)
        return meta

    def forward(
        self,
        indices: torch.Tensor,
        offsets: torch.Tensor,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """As :meth:`TorchTableBatchedEmbeddingBags.forward`; ids of any int dtype."""
        batch_of(offsets, self.num_features, "NativeTableBatchedEmbeddingBags")
        indices = indices.to(torch.int64).contiguous()
        offsets = offsets.to(torch.int64).contiguous()
        first, last = int(offsets[0]), int(offsets[-1])
        if first:  # bags of a larger batch: the kernel wants offsets from 0
            indices, offsets = indices[first:], offsets - first
            last -= first
        if last > indices.numel():
            raise SparseInputError(
                f"offsets end at {last} but there are {indices.numel()} ids",
                where="NativeTableBatchedEmbeddingBags")
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights[first:].to(torch.float32).contiguous()
        trigger = self._trigger if torch.is_grad_enabled() else self._trigger.detach()
        return _NativeLookup.apply(trigger, self, indices, offsets, per_sample_weights)
