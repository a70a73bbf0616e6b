"""Builds the optional native extensions; everything else is in pyproject.toml.

* ``ctrctl.data._fastparse``: the fast path of ``ctrctl preprocess``;
* ``ctrctl.modules._embedding_kernel``: the CPU embedding kernel (pooled lookup, fused
  optimizer update). It includes no torch headers (tensors cross as addresses), so the
  build needs no torch in pip's isolated build environment.
* ``ctrctl.modules._interaction_kernel``: DLRM's dot interaction on CPU, forward and backward
  (the same conventions).

All are optional: where no C compiler is available the build skips them and ctrctl runs
on its polars path, its plain-torch or FBGEMM embedding kernels and torch's interaction.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ctrctl.data._fastparse",
            sources=["ctrctl/data/_fastparse.c"],
            extra_compile_args=["-O3"],
            optional=True,
        ),
        Extension(
            "ctrctl.modules._embedding_kernel",
            sources=["ctrctl/modules/_embedding_kernel.c"],
            # -fno-math-errno lets sqrtf vectorize; -ffp-contract=off rounds as torch
            # does; target_clones in the source picks AVX-512 / AVX2 / baseline loops at
            # load time, so no -march here.
            extra_compile_args=["-O3", "-fno-math-errno", "-ffp-contract=off", "-pthread"],
            extra_link_args=["-pthread"],
            depends=["ctrctl/modules/_native_threads.h"],
            optional=True,
        ),
        Extension(
            "ctrctl.modules._interaction_kernel",
            sources=["ctrctl/modules/_interaction_kernel.c"],
            # Contraction stays on: FMA where the CPU has it (no bitwise match to keep).
            extra_compile_args=["-O3", "-Wno-psabi", "-pthread"],
            extra_link_args=["-pthread"],
            depends=["ctrctl/modules/_native_threads.h"],
            optional=True,
        ),
    ]
)
