"""Builds the optional native fast path of ``ctrctl preprocess``; everything else is in pyproject.toml.

The extension is optional: where no C compiler is available the build skips it and
preprocess runs on its polars path alone.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ctrctl.data._fastparse",
            sources=["ctrctl/data/_fastparse.c"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
