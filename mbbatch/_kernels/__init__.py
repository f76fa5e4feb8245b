"""Numba kernels: pure functions of fixed-dtype arrays and scalars.

Modules
-------
- :mod:`.layout`: how a kernel's arguments are declared (``Layout`` for
  scalars, ``Arrays`` for arrays), once for the kernel and its callers;
- :mod:`.bits`: the raw draws of a numpy bit generator (PCG64DXSM's step
  inlined, any other's called);
- :mod:`.common`: the parts both kernels use (arrival and length codes,
  blocks of random draws (compiled per kind, called by address),
  whole-token rounding, the latency histogram and
  its quantile ranks) and the decorators of kernels and their steps;
- :mod:`.multibin`: the multi-bin paper's model, entry point :func:`.multibin.run`;
- :mod:`.dynamic`: the event kernel of the token-level policies and of
  clusters, entry point :func:`.dynamic.run`; its steps live beside it:
  :mod:`.queues` (the bins' ring buffers), :mod:`.formation` (how a free
  server's batch is chosen, one rule per policy), :mod:`.routing` (a
  cluster's routers) and :mod:`.programs` (a cluster's multi-call programs);
- :mod:`.controller`: Algorithms 1, 2, 4, 6 and 7;
- :mod:`.driver`: the open-loop driver of one stage of resumable engines
  behind its router, compiled with each stage's steps (a cluster's,
  :mod:`.continuous_cluster`; LAPS's, :mod:`.laps`);
- :mod:`.laps`: LAPS's prefill instances behind its router, entry point
  :func:`.laps.run`;
- :mod:`.continuous`: continuous (iteration-level) batching on paged KV
  memory, entry point :func:`.continuous.run`.

They import nothing from the rest of mbbatch.

Caching policy
--------------
Compiled kernels are cached on disk (numba ``cache=True``) beside their source,
so a second process starts without compiling.  Set the environment variable
``MBBATCH_NUMBA_CACHE=0`` before importing mbbatch to turn the cache off (for
example on a read-only install); numba's own ``NUMBA_CACHE_DIR`` moves it.
numba keys each function's cache by its own source file, while a kernel
compiles in the helpers of the other modules here: so whenever any module of
this package changes, importing it drops every cache of the package (see
:func:`_drop_stale_caches`).

Kernels never validate, allocate their outputs, or touch Python objects other
than the ``numpy.random.Generator`` streams they are handed; the public
wrapper, :mod:`mbbatch.simulation`, does all of that.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path

from . import common, continuous, controller, dynamic, laps, multibin  # noqa: F401  (the kernels, as attributes)
from .common import CACHE

__all__ = ["CACHE", "warmup"]


def warmup() -> None:
    """Compile (or load from the cache) every kernel and every controller
    function, so later calls run at full speed.  A cluster's event kernel
    and the helpers ordering its programs' calls are the exception: they
    compile on the first cluster run (see :func:`.dynamic.warmup`); so does
    the continuous-batching kernel on the first ``ContinuousBatching`` run
    (about 27 s of CPU cold, for runs many sessions never make:
    :func:`.continuous.warmup` compiles it ahead); steps
    compiled apart (the draws, shortest-predicted-first's batch, the
    iteration model's batch time) compile on their first use."""
    common.warmup()
    multibin.warmup()
    dynamic.warmup()
    controller.warmup()
    laps.warmup()


def _drop_stale_caches(modules) -> None:
    """Flush the disk cache of every numba function of ``modules`` when the
    package's sources differ from those the caches were written for (their
    hash is kept beside the caches)."""
    if not CACHE:
        return
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    stamp = digest.hexdigest()
    caches = [f._cache for m in modules for f in vars(m).values()
              if getattr(f, "_cache", None) is not None and hasattr(f._cache, "flush")
              and getattr(f, "py_func", None) is not None and f.py_func.__module__ == m.__name__]
    try:
        stamp_file = Path(caches[0].cache_path) / "mbbatch_kernels.sources"
        if stamp_file.is_file() and stamp_file.read_text() == stamp:
            return
        # (the caches of the functions compiled apart are named only here: most imports find the stamp current)
        for cache in caches + common.apart_caches():
            cache.flush()
        stamp_file.write_text(stamp)
    except (IndexError, AttributeError, OSError):
        pass  # no cache to keep, or none we can write: numba compiles afresh


# (every module of the package: a new one needs no line here)
_drop_stale_caches([importlib.import_module(f"{__name__}.{path.stem}")
                    for path in sorted(Path(__file__).parent.glob("*.py")) if path.stem != "__init__"])
