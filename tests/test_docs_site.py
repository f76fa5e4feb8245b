"""The documentation's HTML site builds as `make docs` builds it, with
warnings as errors, with every page, the API reference and every committed
figure (its examples: tests/test_docs_build.py).  A heavy check (a full
Sphinx build), run by `make thorough` and by `make docs` itself."""

import pytest

from tests.test_docs_build import ROOT, _require_doc_tools, _sphinx

pytestmark = pytest.mark.heavy


def test_the_site_builds_without_warnings(tmp_path):
    _require_doc_tools()
    r = _sphinx("html", tmp_path)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    html = tmp_path / "html"
    for page in ("index", "glossary", "cli", "api/index", "api/tables", "gallery/index", "guide/index"):
        assert (html / f"{page}.html").exists(), page
    # the API reference's stubs and the figures the gallery includes from outside docs/
    assert (html / "api" / "generated" / "mbbatch.simulate.html").exists()
    figures = {p.name for p in (ROOT / "figures").glob("*.png")}
    assert figures <= {p.name for p in (html / "_images").glob("*.png")}
