"""The compiled fast path: `delayservice/forward/fast_path.py` built with Cython.

Everything about the package is in pyproject.toml; this only adds the one extension.
The source is copied under build/ as the module `delayservice.forward._fast_path_c`
with the digest of the source appended, so `forward.speedups` uses it only while it
matches the source beside it. Without Cython or a C compiler the package installs as
pure Python and the same code runs interpreted: nothing fails. With
`DELAYSERVICE_PURE_PYTHON=1` nothing is compiled on purpose: a wheel for any platform
(`py3-none-any`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

SOURCE = Path("delayservice/forward/fast_path.py")
MODULE = "delayservice.forward._fast_path_c"


class OptionalBuildExt(build_ext):
    """A failed compile leaves the interpreted fast path in place; it never fails the
    install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            print(f"delayservice: fast path not compiled ({exc}); it runs interpreted")

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"delayservice: {ext.name} not compiled ({exc}); it runs interpreted")


PURE_PYTHON = "DELAYSERVICE_PURE_PYTHON"


def extensions() -> list[Any]:
    if os.environ.get(PURE_PYTHON) == "1":
        print(f"delayservice: {PURE_PYTHON}=1, the fast path runs interpreted")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("delayservice: Cython is not installed; the fast path runs interpreted")
        return []
    text = SOURCE.read_bytes()
    stamped = Path("build/cython") / Path(*MODULE.split(".")).with_suffix(".py")
    stamped.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(text).hexdigest()
    stamped.write_bytes(text + f'\n\nSOURCE_DIGEST = "{digest}"\n'.encode())
    from setuptools import Extension

    extension = Extension(MODULE, [str(stamped)])
    try:
        return list(
            cythonize(
                [extension],
                compiler_directives={"language_level": "3", "annotation_typing": False},
                build_dir="build/cython-c",
                quiet=True,
            )
        )
    except Exception as exc:  # Cython itself failed on the source: run it interpreted
        print(f"delayservice: fast path not translated ({exc}); it runs interpreted")
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
