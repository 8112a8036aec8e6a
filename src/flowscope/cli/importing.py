"""``flowscope import``: read other tools' traces into a run."""

from __future__ import annotations

import argparse

from flowscope.cli.output import console, err_console, print_json, print_table, progress


def register(sub: argparse._SubParsersAction) -> None:
    from flowscope.importers import FORMATS

    p = sub.add_parser("import", help="import traces from other tools (Paje, Darshan, OTF2, Chrome/Perfetto, "
                                      "WfCommons) into a run",
                       description="Import trace files, or folders of them, into a new run of the store, or add "
                                   "them to an existing run (--run, e.g. a Darshan log into the Dask run it "
                                   "belongs to). The format is detected from each file's content. Importing the "
                                   "same file into the same run twice adds nothing.")
    p.add_argument("paths", nargs="+", metavar="FILE_OR_DIR", help="trace files or folders")
    p.add_argument("--run", help="add to this existing run (run id, run directory or 'latest')")
    p.add_argument("--name", help="name of the new run (default: the first file's name)")
    p.add_argument("--format", choices=sorted(FORMATS), help="do not detect: read every file as this format")
    p.add_argument("--store", help="run store directory (default $FLOWSCOPE_STORE or ./flowscope-runs)")
    p.add_argument("--keep-going", action="store_true",
                   help="import the files that can be read and list those that cannot (exit status 1 if any)")
    p.add_argument("--json", action="store_true", help="print what was created as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from flowscope.importers import import_paths

    with progress() as bar:
        tasks: dict[str, int] = {}

        def on_progress(path: str, done: int, total: int) -> None:
            if path not in tasks:
                tasks[path] = bar.add_task(f"importing {path}", total=total)
            bar.update(tasks[path], completed=done)

        res = import_paths(args.paths, args.store, run=args.run, name=args.name, fmt=args.format,
                           progress=on_progress, keep_going=args.keep_going)
    out = {"run_id": res.run_id, "run_dir": str(res.run_dir), "created": res.created, "rows": res.rows,
           "files": [{"path": f.path, "format": f.format, "rows": f.rows, "warnings": f.warnings}
                     for f in res.files], "skipped": res.skipped,
           "failed": [{"path": p, "error": e} for p, e in res.failed]}
    if args.json:
        print_json(out)
        return 1 if res.failed else 0
    for f in res.files:
        for w in f.warnings:
            err_console.print(f"[yellow]warning[/yellow] {f.path}: {w}")
    rows = [[f.path, f.format, ", ".join(f"{t} {n:,}" for t, n in sorted(f.rows.items())) or "nothing"]
            for f in res.files]
    print_table(None, ["file", "format", "rows"], rows)
    if res.skipped:
        console.print(f"skipped {len(res.skipped)} file(s) no importer recognises")
    for path, why in res.failed:
        err_console.print(f"[red]not imported[/red] {why}")
    verb = "created run" if res.created else "added to run"
    console.print(f"{verb} {res.run_id} at {res.run_dir}: "
                  + ", ".join(f"{t} {n:,}" for t, n in sorted(res.rows.items()))
                  + (f"; {len(res.failed)} file(s) could not be read" if res.failed else ""))
    return 1 if res.failed else 0
