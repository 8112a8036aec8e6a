"""The live dashboard's browser side: static assets (plain JavaScript, no build step) that the collector serves."""

from __future__ import annotations

from pathlib import Path


def static_dir() -> Path:
    """The folder of the dashboard's static assets (``timeline.js``: the canvas task stream)."""
    return Path(__file__).resolve().parent / "static"
