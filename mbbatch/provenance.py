"""Provenance of a result: the versions, the code and the commit that made it.

These are deterministic facts about the code (no time, no host): they go in
every Dataset's attrs so that a stored result names what produced it.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import subprocess
from pathlib import Path

__all__ = ["versions", "git_commit", "code_hash"]

_PACKAGE = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=1)
def versions() -> dict:
    import numba
    import numpy
    import scipy

    from ._version import __version__

    return {
        "mbbatch_version": __version__,
        "numpy_version": numpy.__version__,
        "numba_version": numba.__version__,
        "scipy_version": scipy.__version__,
        "python_version": platform.python_version(),
    }


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The commit of the checkout mbbatch runs from (``+dirty`` with
    uncommitted changes), or ``"unknown"`` outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_PACKAGE, capture_output=True, text=True,
                             timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=_PACKAGE,
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """SHA-256 over the source of everything a simulated number depends on:
    the package's modules except the figures and the command line.  A store
    made under another hash was computed by other code."""
    h = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        rel = path.relative_to(_PACKAGE)
        if rel.parts[0] in ("figures", "figures.py") or rel.name == "cli.py":
            continue
        h.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()
