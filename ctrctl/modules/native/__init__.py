"""The native tier: ctrctl's own C kernels, optional, each chosen only where it measured faster.

The rule: native code exists only where a benchmark in ``scripts/`` beats the library path
(torch, MKL, FBGEMM) on the CPU where it is chosen, and every run logs which kernels ran
(:func:`report`, logged by ``train`` and ``quantize``). Without a C compiler the extensions
are not built and everything runs on the library path (``make test-nocc`` checks that).

The kernels, each a C file here with its Python side beside it::

    _embedding_kernel.c    pooled lookup + fused optimizer      embedding.py (backend="native")
    _interaction_kernel.c  DLRM dot interaction, fwd + bwd      ../interaction.py (kernel=)
    _dense_kernel.c        GEMM + bias + ReLU for the MLPs      ../mlp.py (kernel=)
    _native_threads.h      the thread runner (OpenMP or pthreads), ISA choice at load time
    buffers.py             memory the kernels reuse step after step

One word chooses between a native kernel and the library's: ``kernel=`` with the values of
:data:`Kernel` ("auto": the native one where it is built and measured faster here; "native":
insist; "torch": the library's).

Example:
    >>> from ctrctl.modules import native
    >>> print(native.report())      # doctest: +SKIP
    native kernels (AMD EPYC 9R14 ...): embedding built (avx512f+avx2+base) auto->native; ...
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

__all__ = ["KERNELS", "Kernel", "KernelReport", "NativeReport", "log_report", "report"]

#: How a dense or interaction module picks its kernel: "auto", "native" or "torch".
Kernel = Literal["auto", "native", "torch"]
KERNELS: tuple[str, ...] = get_args(Kernel)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelReport:
    """One native kernel: whether it was built, the loops it runs, what ``auto`` picks.

    Attributes:
        role: what it computes (``embedding``, ``interaction``, ``dense``).
        extension: the C extension's module name.
        built: the extension was built and imports.
        isa: the instruction set of the loops in use (None when not built).
        auto: the kernel ``auto`` takes on this machine (``native``, ``torch`` or
            ``fbgemm``).
        note: the condition on that choice, if any.
    """

    role: str
    extension: str
    built: bool
    isa: str | None
    auto: str
    note: str = ""

    def describe(self) -> str:
        built = f"built ({self.isa})" if self.built and self.isa else (
            "built" if self.built else "not built")
        note = f" [{self.note}]" if self.note else ""
        return f"{self.role} {built} auto->{self.auto}{note}"


@dataclass(frozen=True)
class NativeReport:
    """What :func:`report` found: the CPU and one :class:`KernelReport` per kernel."""

    cpu: str
    kernels: tuple[KernelReport, ...]

    def as_tags(self) -> dict[str, str]:
        """MLflow tags: ``ctrctl.native.<role>`` -> ``native|torch|... (isa)``."""
        tags = {"ctrctl.native.cpu": self.cpu}
        for k in self.kernels:
            tags[f"ctrctl.native.{k.role}"] = k.auto + (f" ({k.isa})" if k.isa else "")
        return tags

    def __str__(self) -> str:
        return f"native kernels ({self.cpu}): " + "; ".join(k.describe() for k in self.kernels)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or ``unknown CPU``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def report() -> NativeReport:
    """What was built, which ISA each kernel's loops use and which kernel ``auto`` chooses.

    Imports the modules that load the extensions, so it is meant for the start of a run,
    not for import time. (Preprocess's parser, ``ctrctl.data._fastparse``, is data's and
    says which engine ran in preprocess's own log.)
    """
    from ctrctl.compat import fbgemm_available
    from ctrctl.modules import interaction, mlp
    from ctrctl.modules.native import embedding

    emb_built = embedding.native_available()
    emb_auto = "native" if emb_built else ("fbgemm" if fbgemm_available() else "torch")
    dense_built = mlp.native_dense_available()
    dense_auto = "native" if mlp.native_dense_preferred() else "torch"
    inter_built = interaction.native_interaction_available()
    kernels = (
        KernelReport("embedding", "_embedding_kernel", emb_built, embedding.native_isa(),
                     emb_auto, "CPU, fp32, exact sgd/adagrad/rowwise adagrad"
                     if emb_built else ""),
        KernelReport("interaction", "_interaction_kernel", inter_built,
                     interaction.native_interaction_isa(),
                     "native" if inter_built else "torch", "float32 CPU tensors"
                     if inter_built else ""),
        KernelReport("dense", "_dense_kernel", dense_built, mlp.native_dense_isa(), dense_auto,
                     f"layers >= {mlp.NATIVE_MIN_WIDTH} wide and >= {mlp.NATIVE_MIN_WORK:,} "
                     "multiply-adds" if dense_auto == "native" else
                     ("torch's matmul is the faster one on this CPU" if dense_built else "")),
    )
    return NativeReport(cpu_model(), kernels)


def log_report(log: logging.Logger | None = None) -> NativeReport:
    """Log :func:`report` as one INFO line (on ``log``, default this module's) and return
    it."""
    found = report()
    (log or logger).info("%s", found)
    return found
