"""Which fast path a level runs: the compiled one when it was built from today's source.

`setup.py` compiles `forward/fast_path.py` with Cython, when Cython and a C compiler
are at hand, into `forward._fast_path_c`, stamped with the digest of the source it was
built from. An editable install keeps that module beside the source, so after an edit
it would run yesterday's code: it is used only while the digests agree, and the
interpreted module runs otherwise (the same code, slower).
"""

from __future__ import annotations

import hashlib
import importlib
import logging
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Final

log = logging.getLogger(__name__)

COMPILED: Final = "delayservice.forward._fast_path_c"


def source_digest(path: str | Path) -> str:
    """What `setup.py` stamps the compiled module with: the digest of its source."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def compiled_fast_path() -> ModuleType | None:
    """The compiled module when it is built from the current source, else None."""
    from delayservice.forward import fast_path

    try:
        compiled = importlib.import_module(COMPILED)
    except ImportError:
        return None
    if getattr(compiled, "SOURCE_DIGEST", None) != source_digest(fast_path.__file__):
        log.warning(
            "the compiled fast path was built from an older forward/fast_path.py; running "
            "the interpreted one (pip install -e . builds it again)"
        )
        return None
    return compiled


@cache
def fast_path() -> ModuleType:
    """The fast path to run: compiled when possible, interpreted otherwise."""
    compiled = compiled_fast_path()
    if compiled is not None:
        return compiled
    from delayservice.forward import fast_path as interpreted

    log.info("forwarding runs the interpreted fast path (no current compiled build)")
    return interpreted
