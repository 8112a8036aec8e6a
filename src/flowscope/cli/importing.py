"""``flowscope import``: read other tools' traces into a run, or finish an interrupted import."""

from __future__ import annotations

import argparse

from rich.markup import escape

from flowscope.cli.output import STORE_HELP, console, err_console, print_json, print_table, progress


def register(sub: argparse._SubParsersAction) -> None:
    from flowscope.importers import FORMATS

    p = sub.add_parser("import", help="import traces from other tools (Paje, Darshan, OTF2, Chrome/Perfetto, "
                                      "WfCommons) into a run",
                       description="Import trace files, or folders of them, into a new run of the store, or add "
                                   "them to an existing run (--run, e.g. a Darshan log into the Dask run it "
                                   "belongs to). The format is detected from each file's content. A file whose "
                                   "bytes the run already holds is not imported again. Without --keep-going the "
                                   "import is all or nothing. --resume RUN finishes an import that was killed.")
    p.add_argument("paths", nargs="*", metavar="FILE_OR_DIR", help="trace files or folders")
    p.add_argument("--run", help="add to this existing run (run id, run directory or 'latest')")
    p.add_argument("--resume", metavar="RUN",
                   help="finish the interrupted import of RUN (its process was killed): import the files it had "
                        "not imported yet; takes no files")
    p.add_argument("--name", help="name of the new run (default: the first file's name)")
    p.add_argument("--format", choices=sorted(FORMATS), help="do not detect: read every file as this format")
    p.add_argument("--store", help=STORE_HELP)
    p.add_argument("--keep-going", action="store_true",
                   help="import the files that can be read and list those that cannot (exit status 1 if any)")
    p.add_argument("--json", action="store_true", help="print what was created as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from flowscope.importers import ImportInterrupted, import_paths, resume_import

    if args.resume and (args.paths or args.run or args.name or args.format or args.keep_going):
        raise ValueError("--resume takes no files, --run, --name, --format or --keep-going: the interrupted "
                         "import's own are used")
    if not args.resume and not args.paths:
        raise ValueError("give the trace files or folders to import (or --resume RUN)")
    try:
        with progress() as bar:
            tasks: dict[str, int] = {}

            def on_progress(path: str, done: int, total: int) -> None:
                if path not in tasks:
                    tasks[path] = bar.add_task(f"importing {path}", total=total)
                bar.update(tasks[path], completed=done)

            if args.resume:
                res = resume_import(args.resume, args.store, progress=on_progress)
            else:
                res = import_paths(args.paths, args.store, run=args.run, name=args.name, fmt=args.format,
                                   progress=on_progress, keep_going=args.keep_going)
    except ImportInterrupted as exc:
        err_console.print(f"flowscope import: {exc}", markup=False, highlight=False, soft_wrap=True)
        return 130
    out = {"run_id": res.run_id, "run_dir": str(res.run_dir), "created": res.created, "rows": res.rows,
           "files": [{"path": f.path, "format": f.format, "rows": f.rows, "warnings": f.warnings}
                     for f in res.files], "skipped": res.skipped,
           "duplicates": [{"path": d.path, "format": d.format, "same_as": d.same_as} for d in res.duplicates],
           "failed": [{"path": p, "error": e} for p, e in res.failed]}
    if args.json:
        print_json(out)
        return 1 if res.failed else 0
    for f in res.files:
        for w in f.warnings:  # said after its file's path, unless it begins with it (an importer that says where)
            where = "" if w.startswith(f"{f.path}:") else f"{f.path}: "
            err_console.print(f"[yellow]warning[/yellow] {escape(where + w)}", highlight=False, soft_wrap=True)
    rows = [[f.path, f.format, ", ".join(f"{t} {n:,}" for t, n in sorted(f.rows.items())) or "nothing"]
            for f in res.files]
    if rows:
        print_table(None, ["file", "format", "rows"], rows)
    for d in res.duplicates:
        console.print(f"already imported, not read again: {d.path} (same content as {d.same_as})", markup=False,
                      highlight=False, soft_wrap=True)
    if res.skipped:
        console.print(f"skipped {len(res.skipped)} file(s) no importer recognises")
    for path, why in res.failed:
        err_console.print(f"[red]not imported[/red] {escape(why)}", highlight=False, soft_wrap=True)
    verb = "finished the import into run" if args.resume else ("created run" if res.created else "added to run")
    added = ", ".join(f"{t} {n:,}" for t, n in sorted(res.rows.items())) or "nothing new"
    console.print(f"{verb} {res.run_id} at {res.run_dir}: {added}"
                  + (f"; {len(res.duplicates)} file(s) already imported" if res.duplicates else "")
                  + (f"; {len(res.failed)} file(s) could not be read" if res.failed else ""),
                  markup=False, highlight=False, soft_wrap=True)
    return 1 if res.failed else 0
