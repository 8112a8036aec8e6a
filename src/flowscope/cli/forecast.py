"""``flowscope forecast``: benchmark runs into a window-size model (``bench``) and predict, frame by frame,
what a run's resources will do next (``predict``)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from flowscope.cli.output import LOOKUP_STORE_HELP, console, err_console, fmt_ns, print_json, print_table, progress
from flowscope.cli.semantics import add_semantics_option, open_for

EVENT_HELP = "event kind: idle, compute, communication, io, wait, runtime or other (default idle)"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("forecast", help="forecast what a run's resources will do next (ECDF + KS windows)",
                       description="Frequency analysis of event occurrences (Pallipuram et al.): how many of a "
                                   "run's resources are idle, computing, communicating or doing I/O over time, "
                                   "compared window by window. See docs/forecast.md.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True

    b = verbs.add_parser("bench", help="benchmark runs or traces into a window-size model (JSON)",
                         description="For each run or trace: its event signal, then the KS hit rate of every "
                                     "candidate window size; then one 4th-order polynomial surface over (window "
                                     "size, tasks) per cluster size, cut at 95 %%: the window-size model, written "
                                     "as JSON with the corpus it came from. Trace files are imported into a "
                                     "temporary store that is removed afterwards.")
    b.add_argument("inputs", nargs="+", metavar="TRACE_OR_RUN",
                   help="trace files (any format flowscope imports), run directories or run ids")
    b.add_argument("--event", default="idle", help=EVENT_HELP)
    b.add_argument("-o", "--output", default="forecast-model.json", help="model file to write (default %(default)s)")
    b.add_argument("--windows", type=int, default=50,
                   help="number of candidate window sizes, a geometric series (default %(default)s)")
    b.add_argument("--sizes", default=None, help="the candidate window sizes instead, comma-separated samples")
    b.add_argument("--store", default=None, help=LOOKUP_STORE_HELP)
    b.add_argument("--json", action="store_true", help="print the model's summary as JSON")
    b.set_defaults(func=cmd_bench)

    q = verbs.add_parser("predict", help="predict, frame by frame, what a run's resources do next",
                         description="Over a run (finished, or live: what it holds so far), frame by frame: the "
                                     "likelihood that at least FRACTION of the resources are in EVENT during the "
                                     "next frame (from the current frame's ECDF), what happened, and whether the "
                                     "two frames agreed (KS test at 5 %%). The frame size comes from --model "
                                     "when one fits the run's size; otherwise the default (docs/forecast.md).")
    q.add_argument("run", help="run directory, run id in the store, or 'latest'")
    q.add_argument("--event", default="idle", help=EVENT_HELP)
    q.add_argument("--fraction", default="0.25", help="share of the resources, within [0, 1] (default 0.25)")
    q.add_argument("--model", default=None, help="window-size model written by `flowscope forecast bench`")
    q.add_argument("--window", type=int, default=None, help="frame size in samples (overrides the model)")
    q.add_argument("--store", default=None, help=LOOKUP_STORE_HELP)
    q.add_argument("--frames", type=int, default=20, help="frames to print, the last ones (default 20)")
    q.add_argument("--json", action="store_true", help="print the prediction as JSON")
    add_semantics_option(q)
    q.set_defaults(func=cmd_predict)


def _sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise ValueError(f"--sizes: expected comma-separated integers, got {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise ValueError(f"--sizes: window sizes must be >= 1 sample, got {text!r}")
    return sizes


def cmd_bench(args: argparse.Namespace) -> int:
    import pandas as pd

    from flowscope.analysis.forecast import bench_run, build_model
    from flowscope.analysis.forecast.signal import check_event
    from flowscope.importers import import_paths
    from flowscope.store.catalog import RUN_JSON, resolve_run
    from flowscope.store.run import open_run

    event = check_event(args.event)
    sizes = _sizes(args.sizes) if args.sizes else None
    if args.windows < 1:
        raise ValueError(f"--windows: must be >= 1, got {args.windows}")
    entries = []
    with tempfile.TemporaryDirectory(prefix="flowscope-forecast-") as tmp, progress() as bar:
        for name in args.inputs:
            p = Path(name)
            task = bar.add_task(f"{p.name}: reading", total=None)
            if p.is_file():
                run_dir = import_paths([p], Path(tmp) / "store", name=p.name).run_dir
            elif p.is_dir() and not (p / RUN_JSON).is_file():
                raise ValueError(f"{name}: a folder that is not a run directory (give trace files or runs)")
            else:
                try:
                    run_dir = resolve_run(name, args.store)
                except FileNotFoundError:
                    raise FileNotFoundError(f"{name}: not a trace file, a run directory, nor a run id in the store") from None
            run = open_run(run_dir)
            bar.update(task, description=f"{p.name}: KS over window sizes")
            entries.append(bench_run(run, event, sizes, count=args.windows, source=name,
                                     progress=lambda done, total, task=task: bar.update(task, completed=done,
                                                                                         total=total)))
            run.close()
    model = build_model(entries, event)
    out = model.save(args.output)
    cuts = model.cuts()
    if args.json:
        print_json({"model": str(out), "event": event, "corpus": len(entries),
                    "cuts": model.as_dict()["cuts"]})
        return 0
    def span(e) -> str:
        c = e.curve.dropna(subset=["hit_rate"])
        if not len(c):
            return "-"
        return (f"{c['hit_rate'].iloc[0]:.0%} at {c['window'].iloc[0]} .. {c['hit_rate'].iloc[-1]:.0%} at "
                f"{c['window'].iloc[-1]}")

    print_table(f"corpus ({event})", ["input", "resources", "tasks", "samples", "sample period", "hit rate by window"],
                [[e.source, e.resources, e.tasks, e.samples, fmt_ns(e.period_ns), span(e)] for e in entries])
    print_table(f"window-size model ({event}, cut at {model.cut:.0%})", ["resources", "tasks", "window (samples)"],
                [[r, t, "none reaches the cut" if w is None or pd.isna(w) else int(w)]
                 for r, t, w in cuts.itertuples(index=False)])
    console.print(f"model of {len(entries)} run(s) written to {out}", markup=False, highlight=False, soft_wrap=True)
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from flowscope.analysis.forecast import check_fraction, load_model, predict
    from flowscope.analysis.forecast.signal import check_event

    event = check_event(args.event)
    fraction = check_fraction(args.fraction)
    model = load_model(args.model) if args.model else None
    run = open_for(args)
    pred = predict(run, event, fraction, model, window=args.window)
    if args.json:
        print_json(pred.as_dict())
        return 0
    doc = pred.as_dict()
    err_console.print(pred.note, markup=False, highlight=False, soft_wrap=True)
    console.print(f"run {pred.run_id}: {pred.resources} resources, {pred.tasks} tasks; signal of {doc['signal']['samples']} "
                  f"samples every {fmt_ns(pred.signal.period_ns)}; frames of {pred.window} samples "
                  f"({fmt_ns(doc['frame_ns'])}); query: at least {pred.threshold} of {pred.resources} resources "
                  f"{event}", markup=False, highlight=False, soft_wrap=True)
    frames = doc["frames"][-max(args.frames, 0):] if args.frames else []
    if frames:
        t0 = pred.signal.t0_ns
        print_table(None, ["frame", "from", "to", "predicted", "observed", "KS", "hit"],
                    [[f["frame"], fmt_ns(f["start_ns"] - t0), fmt_ns(f["end_ns"] - t0),
                      "-" if f["likelihood"] is None else f"{f['likelihood']:.2f}", f"{f['observed']:.2f}",
                      "-" if f["ks_statistic"] is None else f"{f['ks_statistic']:.3f}",
                      "-" if f["hit"] is None else ("hit" if f["hit"] else "miss")] for f in frames])
    rate = "n/a (fewer than 2 frames)" if pred.hit_rate is None else f"{pred.hit_rate:.1%}"
    console.print(f"hit rate {rate} over {doc['judged']} judged frames"
                  + (f"; next frame: likelihood {doc['next']['likelihood']:.2f}" if doc["next"] else ""),
                  markup=False, highlight=False, soft_wrap=True)
    cal = doc["calibration"]
    if cal["brier"] is not None:
        console.print(f"Brier score {cal['brier']:.4f} (climatological forecast, the run-so-far frequency: "
                      f"{cal['brier_climatology']:.4f}; skill {cal['brier_skill']:+.3f}) over {cal['frames']} frames"
                      if cal["brier_skill"] is not None else
                      f"Brier score {cal['brier']:.4f} (climatological forecast {cal['brier_climatology']:.4f}) "
                      f"over {cal['frames']} frames", markup=False, highlight=False, soft_wrap=True)
    return 0
