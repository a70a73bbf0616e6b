"""Quantized embedding bags for serving: INT8 / INT4 / INT2 / FP16 / FP8 rows, per table.

The kernel is FBGEMM's inference TBE (``IntNBitTableBatchedEmbeddingBagsCodegen``; HOST
weights on CPU, DEVICE on CUDA). A plain-torch dequantizing kernel over the same bytes sits
beside it: it is the reference the FBGEMM kernel is tested against and the fallback where
fbgemm_gpu is absent.

Row layouts (bytes per row at dim D; scale and bias are fp16, two bytes each)::

    int8   [scale | bias | q_0 ... q_{D-1}]           D + 4     (68 at D=64)
    int4   [scale | bias | q_1 q_0 | q_3 q_2 | ...]   D / 2 + 4 (36 at D=64; low nibble first)
    int2   [scale | bias | four 2-bit values a byte]  D / 4 + 4
    fp16   [x_0 ... x_{D-1} as fp16]                  2 D
    fp8    [x_0 ... x_{D-1} as fp8 e4m3, bias 7]      D

    value = scale * q + bias            (int types; q in 0 .. 2^bits - 1)

``torch.ops.fbgemm.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf`` writes ``[q | scale |
bias]`` (qparams at the END of a row) while the kernel reads them at the START: rows are
placed through the kernel's own weight views (``split_embedding_weights``), which hand out
the ``q`` part and the ``scale | bias`` part separately. Rows are aligned to 1 byte on CPU
(TorchRec pads rows to 16 bytes: 80 bytes per INT8 row at D=64 where 68 suffice) and each
table's block to a 128-byte cache line, as FBGEMM lays them out.

Example:
    >>> qebc = QuantEmbeddingBagCollection.from_float(
    ...     [QuantTableSpec("C1", 1000, 64, "int8"), QuantTableSpec("C2", 50, 64, "int4")],
    ...     {"C1": w1, "C2": w2})
    >>> pooled = qebc(ids, offsets)            # (B, 128): C1's 64 columns, then C2's
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from ctrctl.compat import fbgemm_available
from ctrctl.errors import ConfigError

logger = logging.getLogger(__name__)

QuantDType = Literal["int8", "int4", "int2", "fp16", "fp8"]
QUANT_DTYPES: tuple[str, ...] = ("int8", "int4", "int2", "fp16", "fp8")

#: Bits per value of the integer types.
INT_BITS: dict[str, int] = {"int8": 8, "int4": 4, "int2": 2}
#: FBGEMM's ``SparseType.as_int()`` of each type (what the kernel's ``weights_tys`` holds).
SPARSE_TYPE_INT: dict[str, int] = {"fp32": 0, "fp16": 1, "int8": 2, "int4": 3, "int2": 4,
                                   "bf16": 5, "fp8": 6}
#: Types the lookup can pool into.
OUTPUT_DTYPES: tuple[str, ...] = ("fp32", "bf16")
#: fp16 scale + fp16 bias at the start of an integer row.
SCALE_BIAS_BYTES = 4
#: FBGEMM's default FP8 (e4m3): exponent bits, exponent bias, largest value written.
FP8_EXPONENT_BITS, FP8_EXPONENT_BIAS, FP8_MAX = 4, 7, 240.0
#: Each table's block starts on a cache line (FBGEMM's ``align_to_cacheline``).
CACHE_LINE = 128

Backend = Literal["auto", "fbgemm", "torch"]


def row_bytes(dim: int, dtype: str) -> int:
    """Bytes of one row of a ``dtype`` table of width ``dim`` (row alignment 1)."""
    check_dtype(dtype, dim)
    if dtype in INT_BITS:
        return dim * INT_BITS[dtype] // 8 + SCALE_BIAS_BYTES
    return dim * (2 if dtype == "fp16" else 1)


def check_dtype(dtype: str, dim: int) -> None:
    """Raise :class:`ConfigError` for an unknown type or a width it cannot pack."""
    if dtype not in QUANT_DTYPES:
        raise ConfigError(f"unknown quantized type {dtype!r}", where="quantize",
                          hint=f"use one of {', '.join(QUANT_DTYPES)}")
    per_byte = 8 // INT_BITS[dtype] if dtype in INT_BITS else 1
    if dim <= 0 or dim % per_byte:
        raise ConfigError(f"embedding dim {dim} cannot be stored as {dtype}", where="quantize",
                          hint=f"{dtype} packs {per_byte} values a byte: use a dim that is a "
                          f"multiple of {per_byte}")


@dataclass(frozen=True)
class QuantTableSpec:
    """One quantized table.

    Attributes:
        name: the table's name.
        num_embeddings, embedding_dim: its shape.
        dtype: ``int8``, ``int4``, ``int2``, ``fp16`` or ``fp8``.
        feature_names: the features looked up in it (default: the table's name).
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    dtype: str = "int8"
    feature_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_dtype(self.dtype, self.embedding_dim)
        if not self.feature_names:
            object.__setattr__(self, "feature_names", (self.name,))

    @property
    def row_bytes(self) -> int:
        return row_bytes(self.embedding_dim, self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the quantized table (scale and bias included, no block padding)."""
        return self.num_embeddings * self.row_bytes

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "num_embeddings": self.num_embeddings,
                "embedding_dim": self.embedding_dim, "dtype": self.dtype,
                "feature_names": list(self.feature_names)}


# ---- rows in and out --------------------------------------------------------------------------
def _fp16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float16).to(torch.float32)


def _quantize_int_torch(weight: torch.Tensor, bits: int) -> torch.Tensor:
    """FBGEMM's row-wise n-bit quantization in plain torch: rows ``[q | scale | bias]``."""
    w = weight.float()
    levels = (1 << bits) - 1
    lo = _fp16(w.min(dim=1).values)  # (R,)
    hi = w.max(dim=1).values
    scale = _fp16((hi - lo) / levels)
    scale = torch.where((scale == 0) | torch.isinf(1.0 / scale), torch.ones_like(scale), scale)
    inverse = 1.0 / scale
    q = torch.round((w - lo[:, None]) * inverse[:, None]).clamp(0, levels).to(torch.uint8)
    per_byte = 8 // bits
    q = q.view(q.shape[0], -1, per_byte)  # (R, D / per_byte, per_byte)
    packed = torch.zeros(q.shape[:2], dtype=torch.uint8)
    for j in range(per_byte):
        packed |= q[:, :, j] << (j * bits)
    qparams = torch.stack([scale.half(), lo.half()], dim=1).view(torch.uint8)  # (R, 4)
    return torch.cat([packed, qparams], dim=1)


def quantize_rows(weight: torch.Tensor, dtype: str, *, backend: Backend = "auto") -> torch.Tensor:
    """Quantize FP32 rows (R, D) to (R, row_bytes) uint8 in the op's layout.

    Integer types come out as ``[q | scale | bias]`` (what
    ``FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf`` writes); use :func:`to_kernel_layout`
    to move the qparams to the front. fp16 and fp8 rows are the values' bytes.

    Args:
        weight: (R, D) float rows.
        dtype: the target type.
        backend: "fbgemm" uses FBGEMM's quantization ops, "torch" the plain-torch
            equivalent, "auto" the first that is available.
    """
    check_dtype(dtype, int(weight.shape[1]))
    use_fbgemm = _use_fbgemm(backend)
    w = weight.detach().float().contiguous().cpu()
    if dtype in INT_BITS:
        if use_fbgemm:
            return torch.ops.fbgemm.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(
                w, INT_BITS[dtype])
        return _quantize_int_torch(w, INT_BITS[dtype])
    if dtype == "fp16":
        return w.half().view(torch.uint8)
    if use_fbgemm:
        return torch.ops.fbgemm.FloatToHFP8Quantized(
            w, FP8_EXPONENT_BITS, FP8_EXPONENT_BIAS, FP8_MAX).view(torch.uint8)
    return w.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def to_kernel_layout(rows: torch.Tensor, dtype: str) -> torch.Tensor:
    """``[q | scale | bias]`` -> ``[scale | bias | q]`` (a no-op for fp16 and fp8)."""
    if dtype not in INT_BITS:
        return rows
    return torch.cat([rows[:, -SCALE_BIAS_BYTES:], rows[:, :-SCALE_BIAS_BYTES]], dim=1)


def dequantize_rows(rows: torch.Tensor, dtype: str, dim: int) -> torch.Tensor:
    """Kernel-layout rows (R, row_bytes) uint8 -> (R, dim) float32, in plain torch."""
    if dtype == "fp16":
        return rows.contiguous().view(torch.float16).float()
    if dtype == "fp8":
        # FBGEMM's FP8 (4 exponent bits, bias 7, at most 240) is e4m3's encoding.
        return rows.contiguous().view(torch.float8_e4m3fn).float()
    bits = INT_BITS[dtype]
    qparams = rows[:, :SCALE_BIAS_BYTES].contiguous().view(torch.float16).float()  # (R, 2)
    packed = rows[:, SCALE_BIAS_BYTES:]  # (R, D * bits / 8)
    per_byte = 8 // bits
    mask = (1 << bits) - 1
    shifts = torch.arange(per_byte, dtype=torch.uint8, device=rows.device) * bits
    q = (packed.unsqueeze(2) >> shifts) & mask  # (R, D / per_byte, per_byte)
    q = q.reshape(rows.shape[0], dim).float()  # (R, D)
    return q * qparams[:, :1] + qparams[:, 1:]


def quantization_error_bound(weight: torch.Tensor, dtype: str) -> torch.Tensor:
    """Per element, how far a dequantized value may lie from the FP32 one: (R, D).

    Integer types: half a step, plus the fp16 rounding of the bias (the row minimum, which
    may round above it) and of the scale (which may round below range / levels, so the top
    values clamp). fp16 and fp8: half a unit in the last place of the value.
    """
    w = weight.float()
    fp16_half_ulp = 2.0 ** -11
    if dtype == "fp16":
        return w.abs() * fp16_half_ulp + 2.0 ** -25
    if dtype == "fp8":
        return w.abs() * 2.0 ** -4 + 2.0 ** -10
    levels = (1 << INT_BITS[dtype]) - 1
    lo, hi = w.min(dim=1).values, w.max(dim=1).values
    step = (hi - lo) / levels
    bound = (step / 2 * (1 + fp16_half_ulp) + lo.abs() * fp16_half_ulp
             + levels * step * fp16_half_ulp + 1e-6 * (hi.abs() + lo.abs() + 1e-3))
    return bound[:, None].expand_as(w)


# ---- the collection -----------------------------------------------------------------------------
def _use_fbgemm(backend: str) -> bool:
    if backend not in ("auto", "fbgemm", "torch"):
        raise ConfigError(f"unknown quantized embedding backend {backend!r}",
                          hint="use auto, fbgemm or torch")
    if backend == "torch":
        return False
    available = fbgemm_available()
    if backend == "fbgemm" and not available:
        raise ConfigError("fbgemm_gpu is not available", where="QuantEmbeddingBagCollection",
                          hint='use backend="auto" or "torch"')
    return available


def table_block_offsets(tables: Sequence[QuantTableSpec]) -> tuple[list[int], int]:
    """Where each table's rows start in the flat weight buffer, and the buffer's size."""
    offsets, size = [], 0
    for t in tables:
        offsets.append(size)
        size += -(-t.nbytes // CACHE_LINE) * CACHE_LINE
    return offsets, size


class QuantEmbeddingBagCollection(nn.Module):
    """Sum-pooled lookups in quantized tables, one kernel call for all of them.

    Input is the TBE layout over this collection's features (:meth:`feature_names`, tables
    in order): ``indices`` of feature 0's bags first, then feature 1's, ... and ``offsets``
    with ``F * B + 1`` entries (absolute positions in ``indices``: a slice of a larger
    batch's offsets works). Output: (B, sum of dims) float32, features in order.

    The state is one flat uint8 buffer ``weights`` (FBGEMM's ``weights_host`` layout) and
    the kernel's small index tensors, so the same bytes serve both kernels, a safetensors
    file and an exported program.

    Args:
        tables: the tables, in output order.
        device: "cpu" (HOST weights) or a CUDA device (DEVICE weights).
        backend: "fbgemm" (FBGEMM's kernel), "torch" (the plain dequantizing kernel) or
            "auto" (FBGEMM when fbgemm_gpu imports).
    """

    weights: torch.Tensor
    weights_offsets: torch.Tensor
    weights_tys: torch.Tensor
    weights_placements: torch.Tensor
    D_offsets: torch.Tensor

    def __init__(self, tables: Sequence[QuantTableSpec], device: torch.device | str = "cpu",
                 backend: Backend | str = "auto") -> None:
        super().__init__()
        if not tables:
            raise ConfigError("a quantized collection needs at least one table",
                              where="QuantEmbeddingBagCollection")
        self.tables = list(tables)
        self.device = torch.device(device)
        self.backend = "fbgemm" if _use_fbgemm(backend) else "torch"
        #: The pooled vectors' type: ``fp32``, or ``bf16`` for a bfloat16 dense part (the
        #: kernel then writes half the bytes and nothing converts them afterwards).
        self.output_dtype = "fp32"
        self._block_offsets, size = table_block_offsets(self.tables)
        self.feature_table_map = [t for t, spec in enumerate(self.tables)
                                  for _ in spec.feature_names]
        dims = [self.tables[t].embedding_dim for t in self.feature_table_map]
        self.total_D = sum(dims)
        d_offsets = [0]
        for d in dims:
            d_offsets.append(d_offsets[-1] + d)
        self._max_d = {k: max([self.tables[t].embedding_dim for t in self.feature_table_map
                               if self.tables[t].dtype == k] or [0])
                       for k in ("int2", "int4", "int8", "fp16", "fp8")}
        on_cuda = self.device.type == "cuda"
        # FBGEMM's EmbeddingLocation: DEVICE = 0, HOST = 3.
        placement = 0 if on_cuda else 3
        self.register_buffer("weights", torch.zeros(size, dtype=torch.uint8, device=device))
        self.register_buffer("weights_offsets", torch.tensor(
            [self._block_offsets[t] for t in self.feature_table_map], dtype=torch.int64,
            device=device))
        self.register_buffer("weights_tys", torch.tensor(
            [SPARSE_TYPE_INT[self.tables[t].dtype] for t in self.feature_table_map],
            dtype=torch.uint8, device=device))
        self.register_buffer("weights_placements", torch.full(
            (len(self.feature_table_map),), placement, dtype=torch.int32, device=device))
        self.register_buffer("D_offsets", torch.tensor(d_offsets, dtype=torch.int32,
                                                       device=device))

    # ---- building ------------------------------------------------------------------------------
    @classmethod
    def from_float(cls, tables: Sequence[QuantTableSpec], weights: Mapping[str, torch.Tensor],
                   device: torch.device | str = "cpu", backend: Backend | str = "auto"
                   ) -> QuantEmbeddingBagCollection:
        """Quantize FP32 tables (name -> (rows, dim)) into a new collection."""
        module = cls(tables, device=device, backend=backend)
        module.load_float_weights(weights)
        return module

    @torch.no_grad()
    def load_float_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Quantize and place every table's FP32 rows (name -> (rows, dim))."""
        missing = [t.name for t in self.tables if t.name not in weights]
        if missing:
            raise ConfigError(f"weights for tables {missing} are missing",
                              where="QuantEmbeddingBagCollection.load_float_weights")
        quantized = []
        for spec in self.tables:
            w = weights[spec.name]
            if tuple(w.shape) != (spec.num_embeddings, spec.embedding_dim):
                raise ConfigError(
                    f"table {spec.name!r}: weight of shape {tuple(w.shape)} does not fit "
                    f"({spec.num_embeddings}, {spec.embedding_dim})",
                    where="QuantEmbeddingBagCollection.load_float_weights")
            quantized.append(quantize_rows(w, spec.dtype, backend=self.backend))  # type: ignore[arg-type]
        if self.backend == "fbgemm":
            self._place_with_kernel_views(quantized)
        else:
            for view, rows, spec in zip(self.table_rows(), quantized, self.tables, strict=True):
                view.copy_(to_kernel_layout(rows, spec.dtype).to(view.device))

    def _place_with_kernel_views(self, quantized: list[torch.Tensor]) -> None:
        """Write op-layout rows through FBGEMM's own weight views, then take its buffer."""
        tbe = self._fbgemm_module()
        tbe.initialize_weights()
        views = tbe.split_embedding_weights()  # per table: (q part, scale|bias part or None)
        for (q_view, qparams_view), rows, spec in zip(views, quantized, self.tables,
                                                      strict=True):
            if spec.dtype in INT_BITS:
                assert qparams_view is not None
                q_view.copy_(rows[:, :-SCALE_BIAS_BYTES])
                qparams_view.copy_(rows[:, -SCALE_BIAS_BYTES:])
            else:
                q_view.copy_(rows)
        flat = tbe.weights_dev if self.device.type == "cuda" else tbe.weights_host
        if flat.numel() != self.weights.numel():
            raise ConfigError(f"FBGEMM laid out {flat.numel()} bytes where "
                              f"{self.weights.numel()} were expected",
                              where="QuantEmbeddingBagCollection")
        self.weights.copy_(flat)

    def _fbgemm_module(self) -> Any:
        """FBGEMM's inference TBE over these tables (used to place rows and in tests)."""
        from fbgemm_gpu.split_embedding_configs import SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
        from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
            IntNBitTableBatchedEmbeddingBagsCodegen,
        )

        location = (EmbeddingLocation.DEVICE if self.device.type == "cuda"
                    else EmbeddingLocation.HOST)
        specs = [(t.name, t.num_embeddings, t.embedding_dim, SparseType(t.dtype), location)
                 for t in self.tables]
        return IntNBitTableBatchedEmbeddingBagsCodegen(
            specs, feature_table_map=self.feature_table_map, device=self.device,
            output_dtype=SparseType.FP32, row_alignment=1,
            fp8_exponent_bits=FP8_EXPONENT_BITS, fp8_exponent_bias=FP8_EXPONENT_BIAS)

    # ---- views and sizes -----------------------------------------------------------------------
    def table_rows(self) -> list[torch.Tensor]:
        """Per table, a (rows, row_bytes) uint8 view of its kernel-layout rows."""
        out = []
        for spec, start in zip(self.tables, self._block_offsets, strict=True):
            out.append(self.weights[start:start + spec.nbytes].view(spec.num_embeddings,
                                                                    spec.row_bytes))
        return out

    def dequantized_weights(self) -> dict[str, torch.Tensor]:
        """Every table dequantized to FP32 (name -> (rows, dim))."""
        return {spec.name: dequantize_rows(rows, spec.dtype, spec.embedding_dim)
                for spec, rows in zip(self.tables, self.table_rows(), strict=True)}

    def feature_names(self) -> list[str]:
        return [f for t in self.tables for f in t.feature_names]

    def nbytes(self) -> dict[str, int]:
        """Bytes of each quantized table (scale and bias included)."""
        return {t.name: t.nbytes for t in self.tables}

    # ---- lookups -------------------------------------------------------------------------------
    def set_output_dtype(self, dtype: str) -> None:
        """Pool into ``fp32`` (default) or ``bf16`` (summed in fp32, rounded once)."""
        if dtype not in OUTPUT_DTYPES:
            raise ConfigError(f"unknown pooled output type {dtype!r}",
                              where="QuantEmbeddingBagCollection",
                              hint=f"use one of {', '.join(OUTPUT_DTYPES)}")
        self.output_dtype = dtype

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """(F * B + 1) offsets into ``indices`` -> pooled (B, total_D), float32 (or bfloat16
        after ``set_output_dtype("bf16")``)."""
        if self.backend == "fbgemm":
            return self._fbgemm_lookup(indices, offsets)
        pooled = reference_lookup(self.table_rows(), self.tables, self.feature_table_map,
                                  indices, offsets)
        return pooled if self.output_dtype == "fp32" else pooled.to(torch.bfloat16)

    def _fbgemm_lookup(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        # The lookup op itself rather than the TBE module: the module's forward runs a bounds
        # check that rewrites ``offsets`` in place (a mutation in an exported graph) and keeps
        # a cache queue; ids are checked where requests are built.
        empty_u8 = self.weights.new_empty(0)
        return torch.ops.fbgemm.int_nbit_split_embedding_codegen_lookup_function(
            dev_weights=self.weights,
            uvm_weights=empty_u8,
            weights_placements=self.weights_placements,
            weights_offsets=self.weights_offsets,
            weights_tys=self.weights_tys,
            D_offsets=self.D_offsets,
            total_D=self.total_D,
            max_int2_D=self._max_d["int2"],
            max_int4_D=self._max_d["int4"],
            max_int8_D=self._max_d["int8"],
            max_float16_D=self._max_d["fp16"],
            max_float32_D=0,
            indices=indices,
            offsets=offsets,
            pooling_mode=0,  # sum
            indice_weights=None,
            output_dtype=SPARSE_TYPE_INT[self.output_dtype],
            lxu_cache_weights=self.weights.new_empty((0, 0)),
            lxu_cache_locations=torch.empty(0, dtype=torch.int32, device=self.weights.device),
            row_alignment=1,
            max_float8_D=self._max_d["fp8"],
            fp8_exponent_bits=FP8_EXPONENT_BITS if self._max_d["fp8"] else -1,
            fp8_exponent_bias=FP8_EXPONENT_BIAS if self._max_d["fp8"] else -1,
        )

    def extra_repr(self) -> str:
        kinds = sorted({t.dtype for t in self.tables})
        return f"tables={len(self.tables)}, dtypes={kinds}, backend={self.backend}"


def reference_lookup(table_rows: Sequence[torch.Tensor], tables: Sequence[QuantTableSpec],
                     feature_table_map: Sequence[int], indices: torch.Tensor,
                     offsets: torch.Tensor) -> torch.Tensor:
    """The plain-torch kernel: dequantize the rows each bag reads and sum them.

    Args:
        table_rows: per table, its kernel-layout rows (rows, row_bytes).
        tables: the tables' specs.
        feature_table_map: the table of each feature.
        indices, offsets: the TBE layout (``F * B + 1`` absolute offsets).

    Returns:
        (B, sum of the features' dims) float32.
    """
    num_features = len(feature_table_map)
    batch = (offsets.numel() - 1) // num_features
    lengths = offsets[1:] - offsets[:-1]  # (F * B,)
    outputs = []
    for f, t in enumerate(feature_table_map):
        spec = tables[t]
        start, end = offsets[f * batch], offsets[(f + 1) * batch]
        ids = indices[start:end]
        bags = torch.repeat_interleave(torch.arange(batch, device=indices.device),
                                       lengths[f * batch:(f + 1) * batch])
        rows = dequantize_rows(table_rows[t].index_select(0, ids), spec.dtype,
                               spec.embedding_dim)
        pooled = torch.zeros(batch, spec.embedding_dim, device=rows.device)
        outputs.append(pooled.index_add_(0, bags, rows))  # (B, D)
    return torch.cat(outputs, dim=1)
