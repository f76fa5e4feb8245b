"""Sphinx configuration of the mbbatch documentation.

``make docs`` builds it twice: ``-b doctest`` runs every example (in the
docstrings and in ``{doctest}`` blocks of the pages), then ``-b html`` draws the
site; both with ``-W``, so a warning fails the build.  Nothing is fetched at
build time: no intersphinx, and the theme's network features are off.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# the checkout's package, not an installed copy
sys.path.insert(0, str(ROOT))
# a non-interactive backend: examples that draw never open a window
os.environ.setdefault("MPLBACKEND", "Agg")

import mbbatch  # noqa: E402

sys.path.insert(0, str(HERE))
import _tables  # noqa: E402

# -- project -------------------------------------------------------------------------------
project = "mbbatch"
author = "The mbbatch developers"
copyright = "The mbbatch developers"
release = mbbatch.__version__
version = ".".join(release.split(".")[:2])

# -- extensions ----------------------------------------------------------------------------
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",       # loads in the reader's browser, not at build time
    "numpydoc",
    "myst_parser",
    "sphinxarg.ext",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# the included fragments (``_*.md``, the generated tables) are not pages of their own
exclude_patterns = ["_build", "**/_*.md"]
templates_path = ["_templates"]

# -- MyST ------------------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
# ``[text](#anchor)`` links to a page's headings
myst_heading_anchors = 3

# -- autodoc, autosummary, numpydoc ------------------------------------------------------------
autosummary_generate = True
# the stubs are written to api/generated/ (gitignored), one page per object
autosummary_generate_overwrite = True
autosummary_imported_members = False
autodoc_default_options = {"members": False}
autodoc_typehints = "none"          # numpydoc's Parameters sections carry the types
autodoc_member_order = "bysource"
# the dataclasses' field lists come from their docstrings, not a table of every attribute
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
numpydoc_validation_checks: set[str] = set()

# -- doctest -----------------------------------------------------------------------------------
# A docstring's examples run in its module's namespace (``doctest.testmod``, as the tests run
# them); here they run in one namespace, which holds the names those examples use unqualified.
doctest_global_setup = """
import numpy as np
import scipy.stats as st
from scipy import stats
import mbbatch as mb
from mbbatch import theory
from mbbatch.theory import *
from mbbatch import CalibratedModel, IterationModel, MultiBin, Objective
from mbbatch.profiles import sla_target
from mbbatch.registry import POLICIES, kind_of
import warnings
# examples that show a NaN outside a formula's assumptions also warn; the build log need not
warnings.simplefilter("ignore", mb.theory.OutsideAssumptions)
"""
# the measured serving runs (guide/accuracy.md): where MBBATCH_DATA says, else beside the checkout;
# the page's examples are skipped without them
_SERVING = os.environ.get("MBBATCH_DATA") or str(HERE.parent.parent / "shared" / "data")
doctest_global_setup += f"""
SERVING_DATA = {_SERVING!r}
HAVE_SERVING = {(Path(_SERVING) / "serving" / "apex_plus_vllm_runs.csv").is_file()!r}
FULL_VALIDATION = HAVE_SERVING and {os.environ.get("MBBATCH_DOCS_FULL") == "1"!r}
"""
# the docstrings' examples are doctest blocks too (``>>>`` without a directive)
doctest_test_doctest_blocks = "default"

# -- HTML ------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"mbbatch {release}"
html_static_path: list[str] = []
html_theme_options = {
    # nothing fetched at build time: no icon links, no edit button, no version switcher
    "icon_links": [],
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "footer_start": ["copyright"],
    "footer_end": [],
    "secondary_sidebar_items": ["page-toc"],
    "use_edit_page_button": False,
}
html_show_sourcelink = False
html_last_updated_fmt = None

# -- generated tables ------------------------------------------------------------------------
# the parameter and metric tables of mbbatch.params and mbbatch.metrics, as MyST includes
_tables.write(HERE / "api" / "generated")
