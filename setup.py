"""Builds the optional C hot path (``instrument._speedups``); metadata is in pyproject.toml.

Without a C compiler the build is skipped and instrument runs in pure Python (slower
regions, same results). ``INSTRUMENT_NO_EXTENSIONS=1`` skips it on purpose.
"""

import os

from setuptools import Extension, setup

extensions = []
if not os.environ.get("INSTRUMENT_NO_EXTENSIONS"):
    extensions.append(
        Extension(
            "instrument._speedups",
            ["instrument/_speedups.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    )

setup(ext_modules=extensions)
