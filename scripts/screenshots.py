"""Screenshots of the reports of real traces for the docs (docs/img/report-*.png).

Imports each trace of the shared data folder named below into a temporary store, writes its report, opens it in
headless Chromium (Playwright driving Debian's /usr/bin/chromium, or $FLOWSCOPE_CHROMIUM) at 1400 x 900 and
saves one picture per named section of the page of the report that shows it (FILE#PAGE), once drawn.

    .venv/bin/python scripts/screenshots.py                    # all of them, into docs/img
    .venv/bin/python scripts/screenshots.py --only starpu --out /tmp/shots
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("FLOWSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]

#: name -> (trace, relative to the shared data folder; {(page of the report, element id): picture})
SHOTS: dict[str, tuple[str, dict[tuple[str, str], str]]] = {
    "starpu": ("paje/starpu-demo/paje.trace", {
        ("profile", "pf-breakdown"): "report-starpu-breakdown.png",
        ("critical-path", "cp-task"): "report-starpu-critical-path.png",
    }),
    "otf2": ("otf2/ping-pong-otf2/traces.otf2", {
        ("profile", "pf-flame"): "report-otf2-profile.png",
        ("critical-path", "cp-messages"): "report-otf2-critical-path.png",
    }),
    "darshan": ("darshan/mpi_io_test_with_dxt/treddy_mpi-io-test_id4373053_6-2-60198-9815401321915095332_1.darshan", {
        ("profile", "pf-breakdown"): "report-darshan-breakdown.png",
        ("charts", "ch-io-summary"): "report-darshan-io-summary.png",
    }),
}

DRAWN = """() => window.flowscopeView && flowscopeView.renders > 0 && (window.Plotly === undefined || (
  document.querySelectorAll('.plot').length === document.querySelectorAll('.js-plotly-plot').length &&
  Array.from(document.querySelectorAll('.js-plotly-plot')).every(d => d.calcdata)))"""


def shared_data() -> Path:
    """$FLOWSCOPE_SHARED_DATA, else ../shared/data next to the repository (as the tests find it)."""
    return Path(os.environ.get("FLOWSCOPE_SHARED_DATA") or REPO.parent / "shared" / "data")


def take(names: list[str], data: Path, out: Path) -> list[Path]:
    """Write the pictures of ``names`` (keys of :data:`SHOTS`) into ``out``; returns their paths."""
    from playwright.sync_api import sync_playwright

    import flowscope
    from flowscope.importers import import_paths
    from flowscope.report import write_report

    out.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory(prefix="flowscope-shots-") as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            for name in names:
                rel, sections = SHOTS[name]
                run = flowscope.open_run(import_paths([data / rel], Path(tmp) / "store").run_dir)
                report = write_report(run, Path(tmp) / f"{name}.html")
                for (view, sid), picture in sections.items():
                    page = browser.new_page(viewport={"width": 1400, "height": 900})
                    page.goto(f"{report.as_uri()}#{view}", wait_until="load")
                    page.wait_for_function(DRAWN, timeout=120_000)
                    page.wait_for_timeout(500)  # plotly's transitions and fonts settle
                    target = out / picture
                    page.locator(f"#{sid}").screenshot(path=str(target))
                    written.append(target)
                    print(f"{name}: {view}#{sid} -> {target}")
                    page.close()
        finally:
            browser.close()
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", choices=sorted(SHOTS), help="only these traces (repeatable)")
    ap.add_argument("--data", type=Path, default=shared_data(), help="the shared data folder")
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "img", help="where the pictures go")
    args = ap.parse_args(argv)
    if not args.data.is_dir():
        print(f"screenshots: error: {args.data}: no shared data folder (give --data or FLOWSCOPE_SHARED_DATA)",
              file=sys.stderr)
        return 1
    if not Path(CHROMIUM).exists():
        print(f"screenshots: error: {CHROMIUM}: no chromium (apt-get install chromium, or FLOWSCOPE_CHROMIUM)",
              file=sys.stderr)
        return 1
    take(args.only or list(SHOTS), args.data, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
