"""Deterministic provenance: versions of what produced a result."""

from __future__ import annotations

import functools
import platform


@functools.lru_cache(maxsize=1)
def versions() -> dict:
    import numba
    import numpy
    import scipy

    from . import __version__

    return {
        "mbbatch_version": __version__,
        "numpy_version": numpy.__version__,
        "numba_version": numba.__version__,
        "scipy_version": scipy.__version__,
        "python_version": platform.python_version(),
    }
