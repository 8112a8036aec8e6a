"""Darshan logs read through PyDarshan's darshan-util bindings.

Mapping (docs/formats/darshan.md): the job header and mounts go to run.json; each rank becomes a
``rank`` resource (on its host when DXT names one); DXT_POSIX / DXT_MPIIO segments become ``io`` rows
(``source="darshan-dxt"``); the per-file counters of POSIX, MPI-IO, STDIO, H5F, H5D, PNETCDF, BG/Q and
Lustre become ``metrics`` named ``darshan.<MODULE>.<COUNTER>:<file>``. Modules whose data the log marks
as partial are reported. Added to a run that has task spans, the I/O is attributed to tasks
(:func:`flowscope.analysis.io_attribution.attribute_io`).
"""

from __future__ import annotations

import bz2
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from flowscope.importers import TraceError
from flowscope.importers.sink import ImportSink

NAME = "darshan"

#: what a Darshan log means (model/semantics.py): its rows are I/O records (the io table) and counters; a rank
#: executes, the job and the log are containers
SEMANTICS = {
    "source": "darshan",
    "spans": [],
    "resources": [
        {"when": {"kind": "rank", "resource_id": "darshan:*"}, "executes": True, "slots": 1},
        {"when": {"kind": "container", "resource_id": "darshan:*"}, "executes": False},
    ],
}

DARSHAN_MAGIC = 6567223  # DARSHAN_MAGIC_NR in darshan-log-format.h
#: modules whose records are {base_rec, counters[], fcounters[]}, with the name darshan-util gives their counters
GENERIC = {"POSIX": "POSIX", "MPI-IO": "MPI-IO", "STDIO": "STDIO", "H5F": "H5F", "H5D": "H5D",
           "PNETCDF_FILE": "PNETCDF_FILE", "PNETCDF_VAR": "PNETCDF_VAR", "BG/Q": "BGQ", "DFS": "DFS",
           "DAOS": "DAOS"}
DXT = ("DXT_POSIX", "DXT_MPIIO")
DXT_INTERFACE = {"DXT_POSIX": "POSIX", "DXT_MPIIO": "MPI-IO"}  # the module whose calls each one traces
_SEGMENT = np.dtype([("offset", "<i8"), ("length", "<i8"), ("start", "<f8"), ("end", "<f8")])


def sniff(path: Path, head: bytes) -> bool:
    """A Darshan log: a version string like ``3.41`` then the magic number (either byte order) at byte 8."""
    if len(head) < 16 or not head[:1].isdigit() or head[1:2] != b".":
        return False
    return DARSHAN_MAGIC in (struct.unpack("<q", head[8:16])[0], struct.unpack(">q", head[8:16])[0])


#: log format versions darshan-util 3.5 (PyDarshan 3.5) reads: releases 3.0.0 to 3.5.0 write these
LOG_VERSIONS = ("3.00", "3.10", "3.20", "3.21", "3.41")
#: module ids of log format 3.41 (darshan-log-format.h); older formats are mapped onto them in :func:`_module_name`
MODULE_NAMES = ("NULL", "POSIX", "MPI-IO", "H5F", "H5D", "PNETCDF_FILE", "PNETCDF_VAR", "BG/Q", "LUSTRE",
                "STDIO", "DXT_POSIX", "DXT_MPIIO", "MDHIM", "APXC", "APMPI", "HEATMAP", "DFS", "DAOS")
_COMPRESSION = {0: "zlib", 1: "bzip2", 2: "none"}
_CHUNK = 1 << 20  # bytes read (and decompressed) per step: memory stays bounded on large logs


def _module_name(version: str, index: int) -> str:
    """The module stored at ``index`` of a log's region map. 3.20/3.21 had one PNETCDF module (later split
    into FILE and VAR); before 3.20 H5D did not exist either."""
    if version < "3.20":
        index = index if index <= 3 else (5 if index == 4 else index + 2)
    elif version < "3.41":
        index = index if index <= 5 else index + 1
    return MODULE_NAMES[index] if index < len(MODULE_NAMES) else f"module #{index}"


def _header(path: Path, head: bytes, size: int) -> tuple[str, str, int, list[tuple[str, int, int]]]:
    """Version, compression, header size and the (region name, offset, length) map, checked against the file."""
    def bad(what: str, at: int, region: str = "header") -> TraceError:
        return TraceError(f"{path}: {what} at byte {at} (region {region})")

    if size < 16:
        raise bad(f"file has only {size} bytes, fewer than a Darshan header", size)
    version = head[:8].split(b"\0", 1)[0].decode("ascii", "replace")
    for order in "<>":
        if struct.unpack_from(order + "q", head, 8)[0] == DARSHAN_MAGIC:
            break
    else:
        raise bad(f"magic number is not Darshan's {DARSHAN_MAGIC}", 8)
    if version not in LOG_VERSIONS:
        raise bad(f"log format version {version!r} is not one PyDarshan reads ({', '.join(LOG_VERSIONS)})", 0)
    # 3.41 widened the partial flags to 64 bits and the module map from 16 to 64 entries
    # (uint32 partial flags at byte 20 before; uint64 at byte 24 since)
    n_mods, name_at = (64, 32) if version >= "3.41" else (16, 24)
    mods_at = name_at + 16
    header_size = mods_at + 16 * n_mods + 4 * n_mods
    if size < header_size:
        raise bad(f"file has {size} bytes, fewer than the {header_size}-byte header of format {version}", size)
    comp = head[16]
    if comp not in _COMPRESSION:
        raise bad(f"compression type {comp} is not zlib (0), bzip2 (1) or none (2)", 16)
    name_off, name_len = struct.unpack_from(order + "QQ", head, name_at)
    regions = [("name records", name_off, name_len, name_at)]
    for i in range(n_mods):
        off, length = struct.unpack_from(order + "QQ", head, mods_at + 16 * i)
        if off or length:
            regions.append((_module_name(version, i), off, length, mods_at + 16 * i))
    for name, off, length, at in regions:
        if length and (off < header_size or off + length > size):
            raise bad(f"region map says bytes {off}..{off + length}, outside the file's data "
                      f"({header_size}..{size})", at, name)
    # the job region runs from the header to the first mapped region (darshan_log_get_header's rule)
    starts = [off for _, off, length, _ in regions if off]
    job_end = name_off if name_off else (min(starts) if starts else size)
    if not header_size <= job_end <= size:
        raise bad(f"job region would end at byte {job_end}, outside {header_size}..{size}", name_at, "job")
    out = [("job", header_size, job_end - header_size)]
    used = sorted([(off, off + length, name, at) for name, off, length, at in regions if length]
                  + [(header_size, job_end, "job", name_at)])
    for (a0, a1, an, _), (b0, b1, bn, at) in zip(used, used[1:]):
        if b0 < a1:
            raise bad(f"region map entry says bytes {b0}..{b1}, overlapping region {an} (bytes {a0}..{a1})",
                      at, bn)
    out += [(name, off, length) for name, off, length, _ in regions if length]
    return version, _COMPRESSION[comp], header_size, out


def _decompressor(kind: str):
    return zlib.decompressobj() if kind == "zlib" else bz2.BZ2Decompressor()


def _check_region(f, path: Path, kind: str, name: str, off: int, length: int) -> None:
    """Decompress one region to its end: every stream in it must be whole (zlib checks its adler32,
    bzip2 its CRC) and nothing may follow the last one. Raises TraceError with the first bad byte."""
    if kind == "none":
        return
    f.seek(off)
    pos = off  # file offset of the next byte to feed
    d = _decompressor(kind)
    fed_in_stream = 0
    while pos < off + length:
        chunk = f.read(min(_CHUNK, off + length - pos))
        if not chunk:
            raise TraceError(f"{path}: file ends inside region {name} at byte {pos} (region {name})")
        while chunk:
            before = d.copy() if kind == "zlib" else None
            try:
                _drain(d, kind, chunk)
            except (zlib.error, OSError, EOFError, ValueError) as exc:
                at = _first_bad_byte(before, chunk, pos) if before is not None else pos
                raise TraceError(f"{path}: {kind} data does not decompress ({exc}) at byte {at} "
                                 f"(region {name})") from None
            rest = d.unused_data if d.eof else b""
            used = len(chunk) - len(rest)
            pos += used
            fed_in_stream += used
            chunk = rest
            if d.eof:
                d, fed_in_stream = _decompressor(kind), 0  # darshan-util restarts a stream after each end
    if fed_in_stream:
        raise TraceError(f"{path}: {kind} stream is cut short: region ends before its stream does "
                         f"at byte {off + length} (region {name})")


def _drain(d, kind: str, data: bytes) -> None:
    """Feed ``data`` to ``d``, discarding the output in bounded pieces (memory stays flat whatever the ratio)."""
    d.decompress(data, 1 << 16)
    while not d.eof:
        if kind == "zlib":
            if not d.unconsumed_tail:
                return
            d.decompress(d.unconsumed_tail, 1 << 16)
        else:
            if d.needs_input:
                return
            d.decompress(b"", 1 << 16)


def _first_bad_byte(d, chunk: bytes, pos: int) -> int:
    """The file offset of the byte at which zlib first rejects ``chunk`` (``d`` is the state before it)."""
    for i in range(len(chunk)):
        try:
            d.decompress(chunk[i:i + 1])
        except zlib.error:
            return pos + i
        if d.eof:
            d = zlib.decompressobj()  # the next stream of the region starts after this byte
    return pos + len(chunk)


def validate(path: Path) -> dict[str, Any]:
    """Check a Darshan log before darshan-util reads it, since darshan-util trusts the file (a flipped byte
    can crash the process): the version is one PyDarshan reads, every region of the header's map lies in
    the file without overlapping another, and every region decompresses whole with its checksum.
    Returns the version, compression and regions; raises TraceError naming the file, byte and region."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(2048)
        version, kind, header_size, regions = _header(path, head, size)
        for name, off, length in regions:
            _check_region(f, path, kind, name, off, length)
    return {"version": version, "compression": kind, "header_bytes": header_size,
            "regions": {name: (off, length) for name, off, length in regions}}


class _Log:
    """One open darshan-util log handle; reading errors raise TraceError naming the file and module."""

    def __init__(self, path: Path):
        from darshan.backend import cffi_backend as be

        self.be, self.ffi, self.lib = be, be.ffi, be.libdutil
        self.path = path
        self.log = be.log_open(str(path))
        if self.log["handle"] == self.ffi.NULL:
            raise TraceError(f"{path}: not a readable Darshan log (header invalid or truncated; "
                             f"file has {path.stat().st_size} bytes)")
        self.failed = False

    def records(self, module: str, idx: int, struct_type: str):
        """Yield each record of ``module`` cast to ``struct_type``; the buffer is freed after the yield."""
        n = 0
        while True:
            buf = self.ffi.new("void **")
            r = self.lib.darshan_log_get_record(self.log["handle"], idx, buf)
            if r == 0:
                return
            if r < 0:
                self.failed = True
                raise TraceError(f"{self.path}: module {module} record {n} cannot be read: the log is truncated "
                                 f"or corrupt (file has {self.path.stat().st_size} bytes)")
            try:
                yield self.ffi.cast(struct_type, buf)
            finally:
                self.lib.darshan_free(buf[0])
            n += 1

    def close(self) -> None:
        # darshan_log_close asserts (aborting the process) on a handle whose read failed: leak it instead
        if not self.failed:
            self.lib.darshan_log_close(self.log["handle"])


def _job(log: _Log) -> dict[str, Any]:
    be = log.be
    job = be.log_get_job(log.log)
    start_ns = int(job["start_time_sec"]) * 1_000_000_000 + int(job.get("start_time_nsec") or 0)
    end_ns = int(job["end_time_sec"]) * 1_000_000_000 + int(job.get("end_time_nsec") or 0)
    return {"jobid": int(job["jobid"]), "uid": int(job["uid"]), "nprocs": int(job["nprocs"]),
            "start_ns": start_ns, "end_ns": end_ns, "run_time_s": float(job["run_time"]),
            "log_version": job.get("log_ver"), "metadata": job.get("metadata") or {},
            "exe": be.log_get_exe(log.log), "mounts": [list(m) for m in be.log_get_mounts(log.log)]}


def _names(log: _Log) -> dict[int, str]:
    return dict(log.be.log_get_name_records(log.log))


def _dxt(log: _Log, module: str, idx: int, names: dict[int, str], t0: int,
         prefix: str, in_totals: bool) -> tuple[dict[str, Any], dict[int, str]]:
    """One module's DXT segments as io columns (on the ranks of the log whose resource is ``prefix``), and the
    host of each rank that has segments. ``in_totals`` is False when other rows of the log (the module's
    counters, a lower layer) count the same bytes."""
    ffi = log.ffi
    head = ffi.sizeof("struct dxt_file_record")
    parts: list[np.ndarray] = []
    meta: list[tuple[int, int, str, int, int]] = []  # (record id, rank, host, writes, reads)
    hosts: dict[int, str] = {}
    for rec in log.records(module, idx, "struct dxt_file_record **"):
        w, r = int(rec[0].write_count), int(rec[0].read_count)
        rank = int(rec[0].base_rec.rank)
        host = ffi.string(rec[0].hostname).decode("utf-8", "replace")
        if w + r:
            seg = np.frombuffer(ffi.buffer(ffi.cast("char *", rec[0]) + head, _SEGMENT.itemsize * (w + r)),
                                dtype=_SEGMENT).copy()
            parts.append(seg)
            meta.append((int(rec[0].base_rec.id), rank, host, w, r))
        if rank >= 0 and host:
            hosts.setdefault(rank, host)
    if not parts:
        return {}, hosts
    seg = np.concatenate(parts)
    counts = np.array([w + r for *_, w, r in meta])
    ops = np.concatenate([np.repeat(np.array(["write", "read"]), [w, r]) for *_, w, r in meta])
    rank = np.repeat(np.array([m[1] for m in meta], dtype=np.int64), counts)
    host = np.repeat(np.array([m[2] for m in meta], dtype=object), counts)
    path = np.repeat(np.array([names.get(m[0], f"<record {m[0]:#x}>") for m in meta], dtype=object), counts)
    rid = np.where(rank >= 0, np.char.add(f"{prefix}:rank:", rank.astype(str)), f"{prefix}:shared").astype(object)
    extra = {"interface": DXT_INTERFACE[module]} | ({} if in_totals else {"in_totals": False})
    attrs = np.repeat(np.array([json.dumps({"module": module, "record_id": f"{m[0]:#x}", **extra}) for m in meta],
                               dtype=object), counts)
    cols = {"resource_id": rid, "host": host, "rank": np.where(rank >= 0, rank, -1),
            "source": np.full(len(seg), "darshan-dxt", dtype=object), "op": ops, "path": path,
            "offset": seg["offset"], "nbytes": seg["length"],
            "start_ns": t0 + np.round(seg["start"] * 1e9).astype(np.int64),
            "end_ns": t0 + np.round(seg["end"] * 1e9).astype(np.int64),
            "attrs": attrs}
    return cols, hosts


def _counters(log: _Log, module: str, idx: int, names: dict[int, str], ts: int, t0: int,
              prefix: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """One module's per-file counters as metrics columns and as aggregate io columns (None when darshan-util
    has no names for them)."""
    be, ffi = log.be, log.ffi
    key = GENERIC[module]
    c_names = be.counter_names(key)
    f_names = be.counter_names(key, fcnts=True) or []
    if c_names is None or module not in be._structdefs:
        return None
    ids, ranks, rows = [], [], []
    for rec in log.records(module, idx, be._structdefs[module]):
        c = np.frombuffer(ffi.buffer(rec[0].counters), dtype=np.int64).astype(np.float64)
        f = np.frombuffer(ffi.buffer(rec[0].fcounters), dtype=np.float64) if f_names else np.empty(0)
        rows.append(np.concatenate([c[:len(c_names)], f[:len(f_names)]]))
        ids.append(int(rec[0].base_rec.id))
        ranks.append(int(rec[0].base_rec.rank))
    if not rows:
        return {}, {}
    counter = np.array([f"darshan.{module}.{n}" for n in c_names + f_names], dtype=object)
    values = np.vstack(rows)
    n_rec, n_cnt = values.shape
    files = np.array([":" + names.get(i, f"<record {i:#x}>") for i in ids], dtype=object)
    rids = np.array([f"{prefix}:rank:{r}" if r >= 0 else f"{prefix}:shared" for r in ranks], dtype=object)
    metrics = {"ts_ns": np.full(n_rec * n_cnt, ts, dtype=np.int64),
               "resource_id": np.repeat(rids, n_cnt),
               "namespace": np.full(n_rec * n_cnt, "performance", dtype=object),
               "name": np.tile(counter, n_rec) + np.repeat(files, n_cnt), "value": values.ravel()}
    col = {n: values[:, i] for i, n in enumerate(c_names + f_names)}
    paths = np.array([names.get(i, f"<record {i:#x}>") for i in ids], dtype=object)
    return metrics, _aggregates(module, col, ids, np.array(ranks, dtype=np.int64), paths, rids, t0)


#: per module: the prefix of its counter names, the counters that count reads, writes and opens, and whether its
#: access-size histogram is ``SIZE_<OP>_`` or ``SIZE_<OP>_AGG_`` (darshan-log-format's names)
IO_COUNTERS = {
    "POSIX": ("POSIX", ["READS"], ["WRITES"], ["OPENS"], "SIZE_{}_"),
    "MPI-IO": ("MPIIO", ["INDEP_READS", "COLL_READS", "SPLIT_READS", "NB_READS"],
               ["INDEP_WRITES", "COLL_WRITES", "SPLIT_WRITES", "NB_WRITES"], ["INDEP_OPENS", "COLL_OPENS"],
               "SIZE_{}_AGG_"),
    "STDIO": ("STDIO", ["READS"], ["WRITES"], ["OPENS", "FDOPENS"], None),
    "H5F": ("H5F", [], [], ["OPENS"], None),
    "H5D": ("H5D", ["READS"], ["WRITES"], ["OPENS"], "SIZE_{}_AGG_"),
    "PNETCDF_FILE": ("PNETCDF_FILE", [], [], ["OPENS", "CREATES"], None),
    "PNETCDF_VAR": ("PNETCDF_VAR", ["INDEP_READS", "COLL_READS", "NB_READS"],
                    ["INDEP_WRITES", "COLL_WRITES", "NB_WRITES"], ["OPENS"], "SIZE_{}_AGG_"),
    "DFS": ("DFS", ["READS"], ["WRITES"], ["OPENS", "GLOBAL_OPENS"], "SIZE_{}_"),
    "DAOS": ("DAOS", ["ARRAY_READS"], ["ARRAY_WRITES"], ["OBJ_OPENS", "ARRAY_OPENS", "KV_OPENS"], "SIZE_{}_"),
}
#: modules whose bytes a lower module of the same log counts again (MPI-IO and HDF5 call POSIX, DFS calls DAOS)
LAYERED = frozenset({"MPI-IO", "H5F", "H5D", "PNETCDF_FILE", "PNETCDF_VAR", "DFS"})
SIZE_SUFFIXES = ("0_100", "100_1K", "1K_10K", "10K_100K", "100K_1M", "1M_4M", "4M_10M", "10M_100M", "100M_1G",
                 "1G_PLUS")


def _aggregates(module: str, col: dict[str, np.ndarray], ids: list[int], ranks: np.ndarray, paths: np.ndarray,
                rids: np.ndarray, t0: int) -> dict[str, Any]:
    """One module's per-file counters as aggregate ``io`` rows (docs/data-model.md): per record, a ``read`` and a
    ``write`` row where it read or wrote, and a ``metadata`` row, each over the window between the first and the
    last such operation, with ``attrs`` ops, busy_ns, sizes (access-size histogram) and in_totals."""
    if module not in IO_COUNTERS:
        return {}
    p, reads, writes, opens, hist = IO_COUNTERS[module]
    n = len(ids)
    zero = np.zeros(n)

    def get(name: str) -> np.ndarray:
        return col.get(f"{p}_{name}", zero)

    def count(names: list[str]) -> np.ndarray:
        return np.sum([np.clip(get(c), 0, None) for c in names], axis=0) if names else zero

    def window(start: str, end: str) -> tuple[np.ndarray, np.ndarray]:
        s, e = np.clip(get(start), 0, None), np.clip(get(end), 0, None)
        return (t0 + np.round(s * 1e9).astype(np.int64), t0 + np.round(np.maximum(e, s) * 1e9).astype(np.int64))

    parts = []
    negative: list[str] = []
    busy_name = {"read": "F_READ_TIME", "write": "F_WRITE_TIME", "metadata": "F_META_TIME"}
    for op, ops, nbytes, when, busy in (
            ("read", count(reads), get("BYTES_READ"), ("F_READ_START_TIMESTAMP", "F_READ_END_TIMESTAMP"),
             get("F_READ_TIME")),
            ("write", count(writes), get("BYTES_WRITTEN"), ("F_WRITE_START_TIMESTAMP", "F_WRITE_END_TIMESTAMP"),
             get("F_WRITE_TIME")),
            ("metadata", count(opens), None, ("F_OPEN_START_TIMESTAMP", "F_CLOSE_END_TIMESTAMP"),
             get("F_META_TIME"))):
        keep = np.ones(n, bool) if nbytes is None else (ops > 0) | (nbytes > 0)
        if not keep.any():
            continue
        start, end = window(*when)
        sizes = None
        if hist and op != "metadata" and f"{p}_{hist.format(op.upper())}0_100" in col:
            sizes = np.stack([get(hist.format(op.upper()) + sfx) for sfx in SIZE_SUFFIXES], axis=1).astype(np.int64)
        attrs = []
        for i in np.flatnonzero(keep):
            a = {"interface": module, "aggregate": True, "ops": int(ops[i]), "record_id": f"{ids[i]:#x}"}
            if busy[i] >= 0:  # some logs hold negative times (e.g. -221 s in a 3.1.5 ppc64 log): unknown
                a["busy_ns"] = int(round(float(busy[i]) * 1e9))
            else:
                negative.append(f"{p}_{busy_name[op]}")
            if sizes is not None:
                a["sizes"] = sizes[i].tolist()
            if module in LAYERED:
                a["in_totals"] = False
            attrs.append(json.dumps(a))
        parts.append({"resource_id": rids[keep], "rank": np.where(ranks[keep] >= 0, ranks[keep], -1),
                      "op": np.full(int(keep.sum()), op, dtype=object), "path": paths[keep],
                      "offset": np.full(int(keep.sum()), None, dtype=object),
                      "nbytes": (np.full(int(keep.sum()), None, dtype=object) if nbytes is None
                                 else nbytes[keep].astype(np.int64)),
                      "start_ns": start[keep], "end_ns": end[keep], "attrs": np.array(attrs, dtype=object)})
    if not parts:
        return {}
    out = {k: np.concatenate([pt[k] for pt in parts]) for k in parts[0]}
    out["source"] = np.full(len(out["op"]), "darshan-counters", dtype=object)
    out["host"] = np.full(len(out["op"]), None, dtype=object)
    out["negative_times"] = negative  # taken out by the caller, which warns
    return out


def _lustre(log: _Log, idx: int, names: dict[int, str], ts: int, prefix: str) -> dict[str, list]:
    be, ffi = log.be, log.ffi
    c_names = be.counter_names("LUSTRE", special="COMP_") or []
    out: dict[str, list] = {"ts_ns": [], "resource_id": [], "namespace": [], "name": [], "value": []}
    for rec in log.records("LUSTRE", idx, "struct darshan_lustre_record **"):
        rid = f"{prefix}:rank:{rec[0].base_rec.rank}" if rec[0].base_rec.rank >= 0 else f"{prefix}:shared"
        file = names.get(int(rec[0].base_rec.id), f"<record {int(rec[0].base_rec.id):#x}>")
        for i in range(int(rec[0].num_comps)):
            vals = np.frombuffer(ffi.buffer(rec[0].comps[i].counters), dtype=np.int64)
            for n, v in zip(c_names, vals):
                out["ts_ns"].append(ts)
                out["resource_id"].append(rid)
                out["namespace"].append("performance")
                out["name"].append(f"darshan.LUSTRE.comp{i}.{n}:{file}")
                out["value"].append(float(v))
    return out


def read(path: Path, sink: ImportSink) -> None:
    """Import one Darshan log."""
    path = Path(path)
    try:
        import darshan  # noqa: F401
    except ImportError:
        raise TraceError(f"{path}: reading Darshan logs needs PyDarshan (pip install 'flowscope[import]', or pip install darshan)") from None
    validate(path)
    log = _Log(path)
    try:
        _read(log, path, sink)
    finally:
        log.close()


#: run directory -> (resource segments already read, resource_id -> attrs): one import of many logs reads each
#: segment once, not the whole table again per log
_RESOURCE_CACHE: dict[Path, tuple[set[Path], dict[str, str | None]]] = {}


def _existing_resources(sink: ImportSink) -> dict[str, str | None]:
    """resource_id -> attrs of the resources the run already has (from earlier imports or its own sources)."""
    run_dir = sink.run_dir
    if run_dir is None or not (run_dir / "resources").is_dir():
        return {}
    import pyarrow.parquet as pq

    from flowscope.store.layout import segment_files

    seen, known = _RESOURCE_CACHE.setdefault(Path(run_dir).resolve(), (set(), {}))
    for f in segment_files(run_dir, "resources"):
        if f in seen:
            continue
        t = pq.read_table(f, columns=["resource_id", "attrs"])
        for rid, attrs in zip(t.column("resource_id").to_pylist(), t.column("attrs").to_pylist()):
            if known.get(rid) is None:  # the first non-null attrs, as the run's merged view keeps
                known[rid] = attrs
        seen.add(f)
    return dict(known)


def _log_resource(path: Path, existing: dict[str, str | None]) -> str:
    """The resource id of this log, ``darshan:log:<file name without .darshan>``: a log is one process of a
    non-MPI job, or the whole of an MPI job, so its ranks are its own. Darshan names each log after its user,
    program, job id, time and a per-process hash; another log of the same file name already in the run
    (from another folder) makes this one ``...~2``, ``~3``."""
    stem = path.name.removesuffix(".darshan")
    base = rid = f"darshan:log:{stem}"
    n = 1
    while rid in existing:
        try:
            if json.loads(existing[rid] or "{}").get("file") == str(path.resolve()):
                break  # this very file again: its rows are the same
        except ValueError:
            pass
        n += 1
        rid = f"{base}~{n}"
    return rid


def _read(log: _Log, path: Path, sink: ImportSink) -> None:
    job = _job(log)
    modules = log.be.log_get_modules(log.log)
    names = _names(log)
    t0, t1 = job["start_ns"], job["end_ns"]
    existing = _existing_resources(sink)
    prefix = _log_resource(path, existing)
    partial = sorted(m for m, info in modules.items() if info["partial_flag"])
    for m in partial:
        sink.warn(f"{path}: module {m} filled its Darshan memory buffer while the job ran: its records are incomplete "
                  f"(Darshan's partial flag)")
    if not modules:
        sink.warn(f"{path}: the log has no module data (no instrumented I/O was recorded); "
                  f"only the job's metadata is imported")
    io_parts: list[dict[str, Any]] = []
    hosts: dict[int, str] = {}
    metric_parts: list[dict[str, Any]] = []
    agg_parts: list[dict[str, Any]] = []
    skipped: list[str] = []
    dxt_counts: dict[str, dict[str, int]] = {}
    for module, info in modules.items():
        idx = info["idx"]
        if module in DXT:
            # the module's counters count these bytes too, and MPI-IO's are POSIX's again
            in_totals = module == "DXT_POSIX" and "POSIX" not in modules
            cols, h = _dxt(log, module, idx, names, t0, prefix, in_totals)
            for r, host in h.items():
                hosts.setdefault(r, host)
            if cols:
                io_parts.append(cols)
            dxt_counts[module] = {"segments": len(cols.get("op", ())),
                                  "bytes": int(np.sum(cols["nbytes"])) if cols else 0}
        elif module in GENERIC:
            got = _counters(log, module, idx, names, t1, t0, prefix)
            if got is None:
                skipped.append(module)
            else:
                if got[0]:
                    metric_parts.append(got[0])
                if got[1]:
                    negative = got[1].pop("negative_times")
                    if negative:
                        sink.warn(f"{path}: module {module}: {len(negative)} records hold a negative time "
                                  f"({', '.join(sorted(set(negative)))}); their I/O time is imported as unknown")
                    agg_parts.append(got[1])
        elif module == "LUSTRE":
            cols = _lustre(log, idx, names, t1, prefix)
            if cols["name"]:
                metric_parts.append(cols)
        else:
            skipped.append(module)
        sink.advance(int(path.stat().st_size * (len(dxt_counts) + len(metric_parts)) / max(len(modules), 1)))
    if skipped:
        sink.warn(f"{path}: modules {', '.join(skipped)} are not imported (no per-file counters flowscope maps)")

    # resources: the job (shared by its logs), its hosts, this log, one rank per process of the log
    job_rid = f"darshan:job:{job['jobid']}"
    res: list[dict[str, Any]] = [{"resource_id": job_rid, "kind": "container", "name": job["exe"][:200],
                                  "start_ns": t0, "end_ns": t1,
                                  "attrs": json.dumps({"darshan": "job", "jobid": job["jobid"]})}]
    for host in sorted(set(hosts.values())):
        res.append({"resource_id": f"host:{host}", "kind": "host", "name": host, "host": host})
    res.append({"resource_id": prefix, "kind": "container", "name": path.name, "parent_id": job_rid,
                "start_ns": t0, "end_ns": t1,
                "attrs": json.dumps({"darshan": "log", "file": str(path.resolve()), "jobid": job["jobid"],
                                     "nprocs": job["nprocs"]})})
    for r in range(job["nprocs"]):
        host = hosts.get(r)
        res.append({"resource_id": f"{prefix}:rank:{r}", "kind": "rank", "name": f"rank {r}", "address": str(r),
                    "host": host, "parent_id": prefix, "start_ns": t0, "end_ns": t1})
    res.append({"resource_id": f"{prefix}:shared", "kind": "container", "name": "shared files (all ranks)",
                "parent_id": prefix, "attrs": json.dumps({"darshan": "shared records (rank -1)"})})
    sink.add("resources", [r for r in res if r["resource_id"] not in existing])

    for part in metric_parts:
        sink.add("metrics", part)
    if io_parts or agg_parts:
        import pandas as pd

        def frame(parts: list[dict[str, Any]]) -> pd.DataFrame:
            io = pd.concat([pd.DataFrame(p) for p in parts], ignore_index=True)
            io["host"] = [hosts.get(r, h) if h in (None, "") else h for r, h in zip(io["rank"], io["host"])]
            io["rank"] = io["rank"].where(io["rank"] >= 0, None)
            io["task_key"] = None
            return io

        def add(io: pd.DataFrame) -> None:
            def column(c: str):
                if c in ("rank", "offset", "nbytes"):
                    return pd.array(io[c], dtype="Int64")
                if c in ("host", "path", "task_key"):  # all-null columns come out of concat as float NaN
                    return io[c].astype(object).where(io[c].notna(), None).to_numpy()
                return io[c].to_numpy()
            sink.add("io", {c: column(c) for c in io.columns})

        if io_parts:
            io = frame(io_parts)
            attributed = _attribute(sink, io)  # per operation only: a counter's window spans many tasks
            if attributed is not None:
                sink.set_meta(attributed_to_tasks=attributed)
            add(io)
        if agg_parts:
            add(frame(agg_parts))

    sink.set_meta(log_resource=prefix,
                  job={k: job[k] for k in ("jobid", "uid", "nprocs", "start_ns", "end_ns", "run_time_s",
                                           "log_version", "metadata", "exe")},
                  mounts=job["mounts"],
                  modules={m: {"bytes": int(i["len"]), "version": int(i["ver"]), "partial": bool(i["partial_flag"])}
                           for m, i in modules.items()},
                  partial_modules=partial, dxt=dxt_counts, modules_not_imported=skipped,
                  thread_ids=False, time_resolution="job start/end: 1 s (whole seconds in the header); "
                                                    "DXT segments: relative to job start, double seconds")
    sink.set_run_fields(start_ns=t0, end_ns=t1, command=job["exe"],
                        job={"scheduler_job_id": job["jobid"], "uid": job["uid"], "nprocs": job["nprocs"],
                             "darshan_log": str(path)})


def _attribute(sink: ImportSink, io) -> int | None:
    """Fill io.task_key from the run's task spans, when the run has any; the number of rows attributed."""
    run_dir = sink.run_dir
    if run_dir is None or not (run_dir / "spans").is_dir():
        return None
    import pandas as pd
    import pyarrow as pa

    from flowscope.analysis.io_attribution import TASK_SPANS_SQL, attribute_io
    from flowscope.store.run import open_run

    run = open_run(run_dir)
    # task spans on the local clock the Darshan segments were stamped with, not Dask's shifted one
    tasks = run.sql_arrow(f"SELECT * FROM ({TASK_SPANS_SQL}) WHERE task_key IS NOT NULL").to_pandas(
        types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    if tasks.empty:
        return None
    io["task_key"] = attribute_io(io, tasks)
    return int(io["task_key"].notna().sum())
