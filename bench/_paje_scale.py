"""Large Paje traces made from real ones: copies of a trace's containers, repeated in time.

A real trace (its header untouched) is scaled by ``copies`` x ``repeats``:

* **copies** (K): every container the trace creates gets K copies, named ``NAME@k`` (alias and
  name; the root "0" is shared). Copy k's events are the original's on its own containers, shifted
  by ``k * jitter`` (a few units of the trace's last printed digit, so copies do not tie). Link keys
  become ``KEY@k.r``. The K copies are merged the way K ranks' buffers are: each copy keeps its own
  line order (so a trace that is not time-ordered stays out of order in the same places), and the
  copies are interleaved by the running maximum of their times.
* **repeats** (R): the merged body is played R times, each shifted by the trace's span (rounded up),
  on the same containers when every push has its pop in the original (containers are created in the
  first repeat and destroyed in the last one, as in a long run), or on fresh containers ``NAME@k.r``
  otherwise.

Untimed lines of the body (type and value definitions, comments, blank lines) are written once.
The events' mix (kinds, fields, extra fields, whitespace, quoting, time format) is the original's;
the number of containers grows with K, the number of events per container with R. Every time is
printed with the original token's decimals.

:func:`scale` also writes the trace with its timed lines stably sorted by time after the header and
the untimed lines: what ``pj_dump`` needs for a trace that is not time-ordered (StarPU's
``starpu_paje_sort`` does the same before ``pj_dump``; flowscope sorts by itself).
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_TOKEN = re.compile(r'"[^"]*"|\S+')
_REFS = {"Container", "StartContainer", "EndContainer"}


@dataclass
class _Line:
    """One body line as a template: literal text and placeholders."""

    parts: list  # str, or (kind, value, extra): ("t", float, decimals) ("c", name, quoted) ("k", key, quoted)
    cls: str  # "untimed", "create", "destroy", "event"
    t: float  # the line's time (nan if untimed)


def _parse(path: Path) -> tuple[bytes, list[_Line], int, int]:
    """The header bytes, the body lines as templates, the largest number of time decimals, and whether
    every push has its pop."""
    raw = path.read_bytes().decode()
    lines = raw.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    defs: dict[str, tuple[str, list[str]]] = {}
    cur = None
    fields: list[str] = []
    i = 0
    header: list[str] = []
    for i, line in enumerate(lines):  # i: the first body line, after the loop
        s = line.strip()
        if s and s[0] not in "%#":
            break
        header.append(line)
        if s.startswith("%"):
            p = s[1:].split()
            if p and p[0] == "EventDef":
                cur, fields = (p[1], p[2]), []
            elif p and p[0] == "EndEventDef":
                defs[cur[1]] = (cur[0], fields)
            elif p:
                fields.append(p[0])
    else:
        i = len(lines)
    body = lines[i:]
    created: set[str] = set()
    for line in body:
        toks = _TOKEN.findall(line)
        if toks and toks[0] in defs and defs[toks[0]][0] == "PajeCreateContainer":
            names = defs[toks[0]][1]
            for f in ("Name", "Alias"):
                if f in names:
                    created.add(toks[1 + names.index(f)].strip('"'))
    created.discard("0")
    out: list[_Line] = []
    decimals = 0
    balance: dict[tuple[str, str], int] = {}
    for line in body:
        s = line.strip()
        if not s or s[0] in "#%":
            out.append(_Line([line], "untimed", math.nan))
            continue
        ms = list(_TOKEN.finditer(line))
        kind, names = defs[ms[0].group()]
        if len(ms) != len(names) + 1:
            raise ValueError(f"{path}: a line with {len(ms) - 1} fields for {kind}: {line!r}")
        if "Time" not in names:
            if kind == "PajeTraceFile":
                raise ValueError(f"{path}: includes other files; scale a trace without PajeTraceFile")
            out.append(_Line([line], "untimed", math.nan))
            continue
        parts: list = []
        pos = 0
        t = math.nan
        for j, m in enumerate(ms[1:]):
            f = names[j]
            tok = m.group()
            quoted = tok.startswith('"')
            val = tok[1:-1] if quoted else tok
            ph = None
            if f == "Time":
                t = float(val)
                dec = len(val.split(".", 1)[1]) if "." in val and "e" not in val.lower() else 0
                decimals = max(decimals, dec)
                ph = ("t", t, -1 if "e" in val.lower() else dec)
            elif (f in _REFS or (kind in ("PajeCreateContainer", "PajeDestroyContainer") and f in ("Name", "Alias"))) \
                    and val in created:
                ph = ("c", val, quoted)
            elif f == "Key":
                ph = ("k", val, quoted)
            if ph is not None:
                parts.append(line[pos:m.start()])
                parts.append(ph)
                pos = m.end()
        parts.append(line[pos:])
        if kind in ("PajePushState", "PajePopState"):
            key = (ms[1 + names.index("Container")].group(), ms[1 + names.index("Type")].group())
            balance[key] = balance.get(key, 0) + (1 if kind == "PajePushState" else -1)
        cls = {"PajeCreateContainer": "create", "PajeDestroyContainer": "destroy"}.get(kind, "event")
        out.append(_Line(parts, cls, t))
    header_bytes = ("\n".join(header) + "\n").encode() if header else b""
    return header_bytes, out, decimals, all(v == 0 for v in balance.values())


def _fmt(t: float, dec: int) -> str:
    return repr(t) if dec < 0 else f"{t:.{dec}f}"


@dataclass
class Scaled:
    """What :func:`scale` wrote."""

    copies: int
    repeats: int
    reuse_containers: bool
    lines: int
    bytes: int
    sorted_bytes: int | None
    span: float
    jitter: float


def scale(src: Path, out: Path, target_bytes: int, copies: int = 64, sorted_out: Path | None = None) -> Scaled:
    """Write ``src`` scaled to about ``target_bytes`` to ``out`` (and its time-sorted copy to ``sorted_out``)."""
    header, body, decimals, balanced = _parse(src)
    timed = np.array([ln.t for ln in body])
    known = timed[~np.isnan(timed)]
    lo, hi = (float(known.min()), float(known.max())) if len(known) else (0.0, 0.0)
    span = float(math.ceil((hi - min(lo, 0.0)) * 1.001 + 1))
    # a few units of the 6th decimal: 3 ns in StarPU's milliseconds, 3 us in seconds (never below a ns)
    jitter = 3 * 10.0 ** -min(decimals, 6) if decimals else 0.0
    out_dec = max(decimals, 0)
    # file order of one repeat: (k, i) pairs by the running maximum of copy k's times
    run = np.fmax.accumulate(np.where(np.isnan(timed), -np.inf, timed)) if len(body) else np.zeros(0)
    k_idx = np.repeat(np.arange(copies), len(body))
    i_idx = np.tile(np.arange(len(body)), copies)
    order = np.lexsort((i_idx, k_idx, run[i_idx] + k_idx * jitter))
    pairs = list(zip(k_idx[order].tolist(), i_idx[order].tolist()))
    # bytes of one copy of the timed lines (placeholders as printed: names get "@k", times their decimals)
    once = sum(len(ln.parts[0]) + 1 for ln in body if ln.cls == "untimed")
    per_copy = sum(sum(len(p) if isinstance(p, str) else len(str(p[1])) + (3 if p[0] == "c" else 6 if p[0] == "k"
                                                                          else max(0, out_dec - max(p[2], 0)))
                       for p in ln.parts) + 1 for ln in body if ln.cls != "untimed")
    repeats = max(1, round((target_bytes - len(header) - once) / max(1, per_copy * copies)))
    untimed_done = False
    n_lines = 0
    n_bytes = 0
    with contextlib.ExitStack() as stack:
        f = stack.enter_context(open(out, "w"))
        g = stack.enter_context(open(sorted_out, "w")) if sorted_out is not None else None
        f.write(header.decode())
        n_bytes += len(header)
        if g is not None:
            g.write(header.decode())
            # the untimed body lines first, in file order
            g.writelines(ln.parts[0] + "\n" for ln in body if ln.cls == "untimed")
        for r in range(repeats):
            shift = r * span
            texts: list[str] = []
            times: list[float] = []
            for k, i in pairs:
                ln = body[i]
                if ln.cls == "untimed":
                    if not (untimed_done or k or r):
                        texts.append(ln.parts[0] + "\n")
                        times.append(math.nan)
                    continue
                if balanced and ((ln.cls == "create" and r) or (ln.cls == "destroy" and r < repeats - 1)):
                    continue
                suffix = f"@{k}" if balanced else f"@{k}.{r}"
                buf = []
                tt = math.nan
                for p in ln.parts:
                    if isinstance(p, str):
                        buf.append(p)
                    elif p[0] == "t":
                        s = _fmt(p[1] + shift + k * jitter, p[2] if p[2] < 0 else max(p[2], out_dec if k else p[2]))
                        tt = float(s)
                        buf.append(s)
                    elif p[0] == "c":
                        buf.append(f'"{p[1]}{suffix}"' if p[2] else p[1] + suffix)
                    else:
                        buf.append(f'"{p[1]}@{k}.{r}"' if p[2] else f"{p[1]}@{k}.{r}")
                texts.append("".join(buf) + "\n")
                times.append(tt)
            untimed_done = True
            f.writelines(texts)
            n_lines += len(texts)
            n_bytes += sum(len(x) for x in texts)
            if g is not None:
                tarr = np.array(times)
                keep = np.flatnonzero(~np.isnan(tarr))
                srt = keep[np.argsort(tarr[keep], kind="stable")]
                g.writelines(texts[j] for j in srt.tolist())
    return Scaled(copies, repeats, balanced, n_lines, out.stat().st_size,
                  sorted_out.stat().st_size if sorted_out is not None else None, span, jitter)
