"""The parameter and metric tables of the reference, written from the package at build time.

:data:`mbbatch.params.PARAMS` and :data:`mbbatch.metrics.METRICS` are declared once; the
pages include what this writes (``api/generated/_params_table.md``,
``api/generated/_metrics_table.md``), so the reference cannot drift from the code.
"""

from __future__ import annotations

import re
from pathlib import Path


def _cell(text) -> str:
    """Markdown-safe table cell text: pipes, emphasis and link characters escaped."""
    text = str(text)
    return re.sub(r"([\\|*_`<>\[\]])", r"\\\1", text)


def _code(text) -> str:
    text = str(text).replace("|", "\\|")
    return f"`{text}`" if text else ""


def params_table() -> str:
    from mbbatch.params import PARAMS, REQUIRED

    rows = ["| name | kind | units | domain | default | description |",
            "| --- | --- | --- | --- | --- | --- |"]
    for p in PARAMS.values():
        domain = str(p.domain) if p.domain is not None else (", ".join(p.choices) if p.choices else "")
        default = "required" if p.default is REQUIRED else _code(repr(p.default))
        rows.append(f"| {_code(p.name)} | {p.kind} | {_cell(p.units)} | {_code(domain)} | {default} "
                    f"| {_cell(p.description)} |")
    return "\n".join(rows) + "\n"


def metrics_table() -> str:
    from mbbatch.metrics import METRICS, TAGS

    rows = ["| name | Dataset variable | units | tag | description |",
            "| --- | --- | --- | --- | --- |"]
    for m in METRICS.values():
        rows.append(f"| {_code(m.name)} | {_code(m.var)} | {_cell(m.units)} | {_code(m.tag)} "
                    f"| {_cell(m.description)} |")
    tags = ["| tag | what kind of run |", "| --- | --- |"]
    tags += [f"| {_code(t)} | {_cell(d)} |" for t, d in TAGS.items()]
    return "\n".join(rows) + "\n\nThe tags:\n\n" + "\n".join(tags) + "\n"


def write(folder: Path) -> None:
    """Write the tables into ``folder``, leaving files whose text is unchanged untouched."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in (("_params_table.md", params_table()), ("_metrics_table.md", metrics_table())):
        path = folder / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
