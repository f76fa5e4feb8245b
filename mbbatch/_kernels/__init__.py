"""Numba kernels: pure functions of fixed-dtype arrays and scalars.

Caching policy
--------------
Compiled kernels are cached on disk (numba ``cache=True``) beside their source,
so a second process starts without compiling.  Set the environment variable
``MBBATCH_NUMBA_CACHE=0`` before importing mbbatch to turn the cache off (for
example on a read-only install); numba's own ``NUMBA_CACHE_DIR`` moves it.

Kernels never validate, allocate their outputs, or touch Python objects other
than the ``numpy.random.Generator`` streams they are handed; the public
wrappers in :mod:`mbbatch.simulation` and :mod:`mbbatch.token_simulation` do
all of that.
"""

from __future__ import annotations

import os

CACHE: bool = os.environ.get("MBBATCH_NUMBA_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")

__all__ = ["CACHE", "warmup"]


def warmup() -> None:
    """Compile (or load from cache) every kernel, so later calls run at full speed."""
    from . import controller, dynamic, multibin

    multibin.warmup()
    controller.warmup()
    dynamic.warmup()
