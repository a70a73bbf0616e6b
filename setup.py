"""Builds the optional native extensions; everything else is in pyproject.toml.

* ``ctrctl.data._fastparse``: the fast path of ``ctrctl preprocess``;
* ``ctrctl.modules.native._embedding_kernel``: the CPU embedding kernel (pooled lookup, fused
  optimizer update). It includes no torch headers (tensors cross as addresses), so the
  build needs no torch in pip's isolated build environment.
* ``ctrctl.modules.native._interaction_kernel``: DLRM's dot interaction on CPU, forward and backward
  (the same conventions);
* ``ctrctl.modules.native._dense_kernel``: a GEMM for the MLPs' linear layers on CPUs where torch's
  float32 matmul is slow (AMD's), bias and ReLU fused (the same conventions).

All are optional: where no C compiler is available the build skips them and ctrctl runs
on its polars path, its plain-torch or FBGEMM embedding kernels and torch's interaction.
The three kernels are built with OpenMP where the compiler has it (their threads are then
torch's own OpenMP threads: libgomp.so.1 is the library torch loads), with pthreads where it
does not. ``ctrctl.modules.native.report()`` says which were built and which run.
Set ``CC=/bin/false`` (as ``make test-nocc`` does) to install as a machine without a C
compiler would.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

OPENMP = "-fopenmp"


class BuildExt(build_ext):
    """Builds an extension that asks for OpenMP without it when the compiler has none."""

    def build_extension(self, ext: Extension) -> None:
        if OPENMP in ext.extra_compile_args:
            try:
                super().build_extension(ext)
                return
            except Exception as exc:  # CompileError / LinkError: no OpenMP here
                print(f"building {ext.name} without OpenMP ({exc})")
                ext.extra_compile_args = [a for a in ext.extra_compile_args if a != OPENMP]
                ext.extra_link_args = [a for a in ext.extra_link_args if a != OPENMP]
        super().build_extension(ext)


def kernel(name: str, flags: list[str], headers: tuple[str, ...] = ()) -> Extension:
    """One of the native kernels in ctrctl/modules/native: optional, OpenMP where the compiler has
    it (pthreads otherwise), rebuilt when the thread runner or its loop headers change."""
    return Extension(
        f"ctrctl.modules.native.{name}",
        sources=[f"ctrctl/modules/native/{name}.c"],
        extra_compile_args=["-O3", *flags, "-pthread", OPENMP],
        extra_link_args=["-pthread", OPENMP],
        depends=[f"ctrctl/modules/native/{h}" for h in ("_native_threads.h", *headers)],
        optional=True,
    )


setup(
    cmdclass={"build_ext": BuildExt},
    ext_modules=[
        Extension(
            "ctrctl.data._fastparse",
            sources=["ctrctl/data/_fastparse.c"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        # -fno-math-errno lets sqrtf vectorize; -ffp-contract=off rounds as torch does;
        # target_clones in the source picks AVX-512 / AVX2 / baseline loops at load time,
        # so no -march here.
        kernel("_embedding_kernel", ["-fno-math-errno", "-ffp-contract=off"]),
        # Contraction stays on: FMA where the CPU has it (no bitwise match to keep).
        kernel("_interaction_kernel", ["-Wno-psabi"], ("_interaction_loops.h",)),
        kernel("_dense_kernel", ["-Wno-psabi"], ("_dense_loops.h",)),
    ]
)
