"""A dashboard page as one self-contained HTML file: its stylesheet and scripts inlined (plotly.js included) and
the document it draws embedded, so the file shows what the dashboard showed when it was written, offline and
without a server. The page's own script renders it, the same code as on the dashboard."""

from __future__ import annotations

import json
import re
from pathlib import Path

from flowscope.ui import static_dir

#: the element holding the embedded document (a page's script reads it instead of asking the server)
DOC_ID = "flowscope-doc"
_ASSET = re.compile(r'<link rel="stylesheet" href="/ui/static/([\w.-]+)">|<script src="/ui/static/([\w.-]+)"></script>')


def asset_text(name: str) -> str:
    """The text of the dashboard's asset ``name`` (a file of ui/static; plotly.min.js is flowscope's partial bundle of
    plotly.js, scripts/plotly-bundle/)."""
    return (static_dir() / name).read_text(encoding="utf-8")


def inline_script(code: str) -> str:
    # an inline script ends at the first "</script": one inside the code must not end it
    return "<script>" + re.sub(r"</(script)", r"<\\/\1", code, flags=re.IGNORECASE) + "</script>"


def embed_json(doc: dict) -> str:
    """``doc`` as JSON that is safe inside an HTML ``<script>`` element: no "<", ">" or "&" left as such."""
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def snapshot_page(page: str, doc: dict) -> str:
    """The dashboard's ``page`` (a file of ui/static, such as ``compare.html``) drawing ``doc``, as one HTML text."""
    html = (static_dir() / page).read_text(encoding="utf-8")

    def inline(m: re.Match) -> str:
        css, js = m.group(1), m.group(2)
        return "<style>" + asset_text(css) + "</style>" if css else inline_script(asset_text(js))

    data = f'<script type="application/json" id="{DOC_ID}">{embed_json(doc)}</script>\n'
    first = html.index("<script")
    return _ASSET.sub(inline, html[:first] + data + html[first:])


def write_snapshot(page: str, doc: dict, out: str | Path) -> Path:
    """Write :func:`snapshot_page` to ``out``; returns its path."""
    out = Path(out)
    out.write_text(snapshot_page(page, doc), encoding="utf-8")
    return out
