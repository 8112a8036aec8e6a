"""The live dashboard's browser side: static assets (plain JavaScript, no build step) that the collector serves."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote


def static_dir() -> Path:
    """The folder of the dashboard's static assets (``timeline.js``: the canvas task stream)."""
    return Path(__file__).resolve().parent / "static"


def dashboard_url(address: str, run_id: str | None = None, token: str | None = None, given: str | None = None) -> str:
    """The dashboard's address on a server at ``address`` (its runs list, or ``run_id``'s page), with the token a
    browser hands over once when it was generated; a token the user gave (``given``: where) is never printed, the
    text says how to hand it over instead."""
    page = f"{address}/ui/" + (f"runs/{run_id}" if run_id else "")
    if token and given:
        return f"{page} (open {page}?token=TOKEN with the token given by {given})"
    return page + (f"?token={quote(token, safe='')}" if token else "")
