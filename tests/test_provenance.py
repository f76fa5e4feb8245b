"""Provenance (mbbatch.provenance): versions, the commit and the code hash a
result records."""

import mbbatch as mb
from mbbatch import provenance


def test_versions_name_the_stack():
    v = provenance.versions()
    assert v["mbbatch_version"] == mb.__version__
    assert set(v) == {"mbbatch_version", "numpy_version", "numba_version", "scipy_version", "python_version"}


def test_code_hash_is_stable_and_hex():
    h = provenance.code_hash()
    assert len(h) == 64 and int(h, 16) >= 0 and h == provenance.code_hash()
    assert isinstance(provenance.git_commit(), str)


def test_the_version_is_pyprojects():
    import tomllib

    from .helpers import ROOT

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == mb.__version__
