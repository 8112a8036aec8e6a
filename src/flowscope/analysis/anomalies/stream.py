"""Streaming, distributed detection as in Chimbuko: a detector next to each producer judges calls
against the latest global model plus its own data since the last sync and hands its local statistics
to a parameter server, which merges them and returns the global model."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from flowscope.analysis.anomalies import _step_kernels
from flowscope.analysis.anomalies.config import AnomalyConfig
from flowscope.analysis.anomalies.model import _FINE_REP, FINE_BINS, FunctionModel, batch_moments, fine_bin, scorer


_STATS = ("_count", "_mean", "_m2", "_min", "_max")


def add_at(hist: np.ndarray, keys: np.ndarray, counts: np.ndarray | None = None) -> None:
    """``np.add.at(hist.reshape(-1), keys, counts or 1)`` for int64 histograms, compiled (``_step_kernels``)."""
    bad = _step_kernels.hist_add(hist, np.ascontiguousarray(keys, np.int64),
                                 None if counts is None else np.ascontiguousarray(counts, np.int64))
    if bad >= 0:
        raise IndexError(f"histogram key {int(keys[bad])} is outside the histogram's {hist.size} cells")


class ParameterServer:
    """Holds the global model; ``exchange`` merges a detector's local statistics and returns a copy,
    ``exchange_since`` returns only the functions that changed since the detector's last exchange, and
    ``exchange_rows`` does the same with function numbers agreed once (``codes``) instead of names.

    ``model`` and ``updates`` restore a saved state; ``save(model, updates)``, if given, is called with
    each new state of ``update``/``exchange``/``exchange_since`` before it is adopted (so an exchange whose
    save raises changes nothing); ``exchange_rows``, for detectors in the same process, merges in place
    without saving."""

    def __init__(self, model: FunctionModel | None = None, updates: int = 0,
                 save: Callable[[FunctionModel, int], None] | None = None) -> None:
        self.model = model if model is not None else FunctionModel()
        #: held while the model changes; hold it to read ``model`` and ``updates`` together
        self.lock = threading.RLock()
        self.updates = int(updates)
        self._save = save
        # per function: the update that last changed it (a restored model's functions: the restored version)
        self._changed = np.full(len(self.model), self.updates, np.int64)
        # histogram increments (update, detector, flat keys code * FINE_BINS + cell, counts) that detectors
        # exchanging rows have not all seen yet
        self._log: list[tuple[int, int, np.ndarray, np.ndarray]] = []
        self._seen: dict[int, int] = {}         # detector -> the update its view includes

    def join(self) -> int:
        """A number for a detector that exchanges rows (``exchange_rows``)."""
        with self.lock:
            me = len(self._seen)
            self._seen[me] = self.updates  # its first exchange gets whole histogram rows, not increments
            return me

    def _log_hist(self, who: int, keys: np.ndarray, counts: np.ndarray) -> None:
        if self._seen and len(keys):
            self._log.append((self.updates, who, keys, counts))

    def _grow_changed(self) -> None:
        if len(self._changed) < len(self.model):
            grown = np.zeros(max(len(self.model), 2 * len(self._changed)), np.int64)
            grown[:len(self._changed)] = self._changed
            self._changed = grown

    def _merge(self, local: FunctionModel) -> None:
        if self._save is None:
            self.model.merge_in(local)
        else:
            merged = self.model.merge(local)
            self._save(merged, self.updates + 1)
            self.model = merged
        self.updates += 1
        self._grow_changed()
        if len(local):
            idx = self.model.codes(local.names)
            self._changed[idx] = self.updates
            if local.histograms and self._seen:
                r, cell = np.nonzero(local.hist)
                self._log_hist(-1, idx[r] * FINE_BINS + cell, local.hist[r, cell])

    def update(self, local: FunctionModel) -> int:
        """Merge a detector's local statistics into the global model; returns the new version."""
        with self.lock:
            self._merge(local)
            return self.updates

    def exchange(self, local: FunctionModel) -> FunctionModel:
        """:meth:`update`, then a copy of the global model."""
        with self.lock:
            self._merge(local)
            return self.model.copy()

    def exchange_since(self, local: FunctionModel, since: int) -> tuple[int, FunctionModel]:
        """Merge ``local``; return the new version and the global statistics of every function changed after
        version ``since`` (by any detector, this one included)."""
        with self.lock:
            self._merge(local)
            return self.updates, self.model.subset(np.flatnonzero(self._changed[:len(self.model)] > since))

    def codes(self, names: Sequence[str], histograms: bool) -> np.ndarray:
        """The server's numbers of functions ``names`` (new ones are added, empty), for ``exchange_rows``."""
        with self.lock:
            self.model._check_merge(FunctionModel(histograms))  # an empty model takes the detectors' kind
            out = self.model.codes(list(names))
            self._grow_changed()
            return out

    def exchange_rows(self, who: int, codes: np.ndarray, stats: tuple[np.ndarray, ...],
                      hist: tuple[np.ndarray, np.ndarray] | None, since: int, known: int
                      ) -> tuple:
        """Merge detector ``who``'s local statistics given per server function number (count, mean, M2, min,
        max, and the histogram increments as flat keys ``code * FINE_BINS + cell`` with counts, or None without
        histograms). Returns the new version, the names of the functions numbered from ``known`` on, the numbers
        and global moments of every function changed after version ``since``, and either those functions'
        whole histogram rows (``since`` 0: a detector's first exchange) or the histogram increments of the other
        detectors since then (the detector's view has its own already)."""
        with self.lock:
            m = self.model
            if (hist is not None) != m.histograms:
                raise ValueError("exchange_rows: histograms on one side only (see FunctionModel._check_merge)")
            if len(codes):
                m._merge_rows(codes, *stats)
            self.updates += 1
            if hist is not None and len(hist[0]):
                add_at(m._hist, hist[0], hist[1])
                self._log_hist(who, *hist)
            self._changed[codes] = self.updates
            rows = np.flatnonzero(self._changed[:len(m)] > since)
            out = tuple(getattr(m, a)[rows] for a in _STATS)
            others = rows_hist = None
            if m.histograms and since == 0:  # a detector's first exchange: whole rows
                rows_hist = m._hist[rows]
            elif m.histograms:
                mine = [(k, c) for v, w, k, c in self._log if v > since and w != who]
                others = (np.concatenate([k for k, _ in mine]) if mine else np.zeros(0, np.int64),
                          np.concatenate([c for _, c in mine]) if mine else np.zeros(0, np.int64))
            self._seen[who] = self.updates
            oldest = min(self._seen.values())
            if self._log and self._log[0][0] <= oldest:
                self._log = [e for e in self._log if e[0] > oldest]
            return self.updates, m.names[known:], rows, out, rows_hist, others

    def exchange_moments(self, who: int, local: tuple[np.ndarray, ...], to_server: np.ndarray, since: int,
                         known: int, from_server: np.ndarray, view: tuple[np.ndarray, ...],
                         hist: tuple[np.ndarray, np.ndarray] | None = None,
                         refresh: tuple | None = None) -> tuple[int, tuple[np.ndarray, np.ndarray] | None] | None:
        """:meth:`exchange_rows` for a detector in this process, compiled (``_step_kernels.sync_moments``): merge
        its local moments (``local``: count, mean, M2, min, max per view code, the detector's view size long;
        reset to empty on the way) and write the global moments of every function changed after ``since`` into
        ``view`` (the detector's arrays), with the maps ``to_server`` (view code -> server code) and
        ``from_server`` (server code -> view code, ``known`` long). ``hist`` as in :meth:`exchange_rows` (keys in
        server numbers); ``refresh`` = (std, cut, sigma, min_count, mature, near): SSTD's per-function std and
        keep threshold, recomputed for the functions written. Returns the new version and the other detectors'
        histogram increments since ``since`` (None without histograms), or None, having changed nothing, when
        the detector must take :meth:`exchange_rows` (the server has functions it has not mapped, one of its
        functions has no server number yet, or its first exchange needs whole histogram rows)."""
        with self.lock:
            m = self.model
            if len(m) != known or (hist is not None) != m.histograms or (m.histograms and since == 0):
                return None
            version = self.updates + 1
            std, cut, sigma, min_count, mature, near = refresh or (None, None, 0.0, 0, 0, 0.0)
            status = _step_kernels.sync_moments(
                len(local[0]), local, to_server, len(m), (m._count, m._mean, m._m2, m._min, m._max), self._changed,
                version, since, from_server, view, refresh is not None, std, cut, sigma, min_count, mature, near)
            if status:
                return None
            self.updates = version
            others = None
            if hist is not None:
                if len(hist[0]):
                    add_at(m._hist, hist[0], hist[1])
                    self._log_hist(who, *hist)
                mine = [(k, c) for v, w, k, c in self._log if v > since and w != who]
                others = (np.concatenate([k for k, _ in mine]) if mine else np.zeros(0, np.int64),
                          np.concatenate([c for _, c in mine]) if mine else np.zeros(0, np.int64))
            self._seen[who] = version
            if self._log:
                oldest = min(self._seen.values())
                if self._log[0][0] <= oldest:
                    self._log = [e for e in self._log if e[0] > oldest]
            return version, others

    def snapshot(self) -> FunctionModel:
        with self.lock:
            return self.model.copy()


class Detector:
    """Judges batches of calls of one producer; ``sync`` trades local statistics for the global model.

    SSTD detectors keep moments only (no histograms). With ``keep=True`` a detector also keeps the calls a
    grown model could still flag -- those flagged, near misses (HBOS: a bin score within 3 bits of the
    threshold, or a grid cell holding at most ``rare`` calls; SSTD: beyond ``near`` x sigma, half by default,
    as a few early anomalies can inflate a young model's std) and calls judged while their function had fewer
    than ``mature`` calls -- and ``final(model)`` judges them against the final model: with a stationary workload that is exactly the set one pass over the
    whole run flags, without keeping the other calls.

    ``process`` takes function codes into a list of names; passing the same list object again (it may grow
    by appending, its entries must not change) lets the detector reuse its numbering of those names.

    ``compiled`` (the default) runs a step in the compiled kernel (``_step_kernels.c``: a few passes over the
    step's calls, no per-function numpy calls); ``compiled=False`` runs the numpy formulation it reproduces bit
    for bit (the reference the tests compare it with).
    """

    def __init__(self, config: AnomalyConfig | None = None, global_model: FunctionModel | None = None, *,
                 keep: bool = False, mature: int = 1000, near: float = 0.5, rare: int = 8, compiled: bool = True):
        self.config = config or AnomalyConfig()
        self._hist = self.config.algo == "hbos"
        self.view = global_model.copy() if global_model is not None else FunctionModel(self._hist)  # global + local
        self._local = self._aligned(FunctionModel(self._hist))
        self.synced_version = 0                # the parameter server's version this view includes
        self.keep = keep
        self.mature = int(mature)
        self.near = float(near)
        self.rare = int(rare)
        self.seen = 0                          # calls processed so far (the default ids of kept calls)
        self._kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (ids, view codes, values)
        self._names_src: Sequence[str] | None = None  # the last ``functions`` list and its view codes (-1: unknown)
        self._names_map = np.zeros(0, np.int64)
        self._server: ParameterServer | None = None   # the server this detector numbers functions with
        self._who = -1                                 # this detector's number there
        self._pending: list[np.ndarray] = []           # hbos: flat view keys of the calls since the last sync
        self._hist_flushed = False                     # the local histogram may hold counts
        self._to_server = np.zeros(0, np.int64)        # view code -> server code (-1: not yet)
        self._from_server = np.zeros(0, np.int64)      # server code -> view code
        self._server_known = 0                         # server codes this detector has mapped
        self._std = np.zeros(0)                        # sstd, per view code: std where judged, else inf
        self._cut = np.zeros(0)                        # sstd, per view code: score from which a call is kept
        self.compiled = bool(compiled)
        # the compiled step's per-function scratch (count, sum, M2), all zero between steps
        self._scratch = (np.zeros(0, np.int64), np.zeros(0), np.zeros(0))

    # the local statistics are kept with the view's function numbering, so that one batch's moments update both
    def _aligned(self, model: FunctionModel) -> FunctionModel:
        self.view.codes(model.names)
        out = FunctionModel(model.histograms)
        out.codes(self.view.names)
        out.merge_in(model)
        return out

    @property
    def local(self) -> FunctionModel:
        """Statistics of the calls seen since the last sync (for ``min`` and ``max``: of the calls that moved
        the view's, which is all a merge into the global model needs)."""
        self._flush_pending()
        return self._local

    @local.setter
    def local(self, model: FunctionModel) -> None:
        self._flush_pending()
        self._local = self._aligned(model)
        self._hist_flushed = True

    def _grown(self) -> None:
        """Storage indexed by view code as long as the view."""
        n = len(self.view)
        if len(self._local) < n:  # the local model's names are the view's, in order: no lookups needed
            self._local._grow(self.view.names[len(self._local):])
        if len(self._std) < n:
            k = max(n, 2 * len(self._std))
            self._std = np.concatenate([self._std, np.full(k - len(self._std), np.inf)])
            self._cut = np.concatenate([self._cut, np.full(k - len(self._cut), -np.inf)])
            self._to_server = np.concatenate([self._to_server, np.full(k - len(self._to_server), -1, np.int64)])
        if len(self._scratch[0]) < len(self._std):
            k = len(self._std)
            self._scratch = (np.zeros(k, np.int64), np.zeros(k), np.zeros(k))

    def _map(self, functions: Sequence[str], func: np.ndarray) -> np.ndarray:
        """View codes of the calls ``func`` (codes into ``functions``); a list seen before (the same object,
        possibly grown by appending) is not looked up again."""
        if functions is not self._names_src:
            self._names_src, self._names_map = functions, self.view.codes(list(functions))
        elif len(self._names_map) < len(functions):  # the list grew
            self._names_map = np.concatenate([self._names_map,
                                              self.view.codes(list(functions[len(self._names_map):]))])
        self._grown()
        return self._names_map[func]

    def _refresh(self, rows: np.ndarray) -> None:
        """SSTD: the per-function std and keep threshold of the view's functions at ``rows``."""
        n = self.view._count[rows]
        std = np.sqrt(np.where(n > 1, self.view._m2[rows] / np.maximum(n - 1, 1), 0.0))
        judged = (n >= max(self.config.min_count, 2)) & (std > 0)
        self._std[rows] = np.where(std > 0, std, np.inf)
        self._cut[rows] = np.where(n < self.mature, -np.inf, np.where(judged, self.near * self.config.sigma, np.inf))

    def process(self, functions: Sequence[str], func: np.ndarray, values: np.ndarray,
                ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Add calls (``func`` codes into ``functions``) to the model, then judge them: (score, flagged).
        ``ids`` name the calls for ``final`` (default: their running number in this detector)."""
        func = np.asarray(func, np.int64)
        values = np.asarray(values, np.float64)
        if not len(func):
            return np.zeros(0), np.zeros(0, bool)
        vcodes = self._map(functions, func)
        view, loc = self.view, self._local
        if self.compiled:
            step = self._hbos_step if self._hist else self._sstd_step
            score, flagged, sel = step(vcodes, np.ascontiguousarray(values))
            if self.keep:
                self._keep(func, ids, sel, vcodes, values)
            self.seen += len(func)
            return score, flagged
        touched, nb, mb, m2b = batch_moments(vcodes, values, len(view), minmax=False)
        # min and max: only the calls beyond the view's can move them (here and in the global model)
        for arr, ufunc, beyond in (("_max", np.maximum, np.greater), ("_min", np.minimum, np.less)):
            beyond = beyond(values, getattr(view, arr)[vcodes])
            if beyond.any():
                idx = np.flatnonzero(beyond)
                ufunc.at(getattr(view, arr), vcodes[idx], values[idx])
                ufunc.at(getattr(loc, arr), vcodes[idx], values[idx])
        view._merge_rows(touched, nb, mb, m2b)
        loc._merge_rows(touched, nb, mb, m2b)
        if self._hist:
            keys = vcodes * FINE_BINS + fine_bin(values)
            np.add.at(view._hist.reshape(-1), keys, 1)
            self._pending.append(keys)  # the local histogram's increments, applied when they are needed
            sc = scorer(view, self.config, touched)  # tables for the functions of this batch only
            score, flagged = sc.score(vcodes, values)
            if self.keep:
                cut = np.where(view.count[touched] < self.mature, -np.inf,
                               np.where(sc.judged, sc.threshold - 3.0, np.inf))
                # a bin's score moves as the model's range and bin width change, so calls in a rare grid cell
                # are kept too: a call the final model flags sits in a bin of at most a few calls, and its cell
                # had no more than that when it was judged
                again = (score >= cut[sc.pos[vcodes]]) | (view._hist.reshape(-1)[keys] <= self.rare)
        else:
            self._refresh(touched)
            score = np.subtract(values, view._mean[vcodes])
            np.abs(score, out=score)
            score /= self._std[vcodes]
            flagged = score > self.config.sigma
            if self.config.min_count > 2:
                flagged &= view._count[vcodes] >= self.config.min_count
            if self.keep:
                again = score >= self._cut[vcodes]
        if self.keep:  # (a flagged call is always past the keep threshold)
            self._keep(func, ids, np.flatnonzero(again), vcodes, values)
        self.seen += len(func)
        return score, flagged

    def process_steps(self, functions: Sequence[str], func: np.ndarray, values: np.ndarray, bounds: np.ndarray,
                      ids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Several consecutive steps at once: step k is the calls ``bounds[k]:bounds[k + 1]`` (``bounds`` runs from
        0 to ``len(func)`` and never decreases), each added to the model and judged in order as its own ``process``
        call would, with no sync between them; (score, flagged) of every call. For a producer that hands over
        several steps' calls at a time and syncs once per hand-over: the compiled detector runs them in one kernel
        call instead of one Python call per step."""
        func = np.asarray(func, np.int64)
        values = np.asarray(values, np.float64)
        b = np.ascontiguousarray(bounds, np.int64)
        if b.ndim != 1 or len(b) < 1 or b[0] != 0 or b[-1] != len(func) or (np.diff(b) < 0).any():
            raise ValueError(f"bounds must run from 0 to the {len(func)} calls and never decrease, got "
                             f"{b.tolist()[:10]}{' ...' if b.size > 10 else ''}")
        if len(values) != len(func):
            raise ValueError(f"values: expected {len(func)}, got {len(values)}")
        if not self.compiled or not len(func):
            every = np.arange(self.seen, self.seen + len(func)) if ids is None else np.asarray(ids, np.int64)
            parts = [self.process(functions, func[lo:hi], values[lo:hi], ids=every[lo:hi])
                     for lo, hi in zip(b[:-1].tolist(), b[1:].tolist())]
            return (np.concatenate([p[0] for p in parts]) if parts else np.zeros(0),
                    np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, bool))
        vcodes = self._map(functions, func)
        step = self._hbos_step if self._hist else self._sstd_step
        score, flagged, sel = step(vcodes, np.ascontiguousarray(values), b)
        if self.keep:
            self._keep(func, ids, sel, vcodes, values)
        self.seen += len(func)
        return score, flagged

    def _keep(self, func: np.ndarray, ids: np.ndarray | None, sel: np.ndarray, vcodes: np.ndarray,
              values: np.ndarray) -> None:
        ids = np.arange(self.seen, self.seen + len(func)) if ids is None else np.asarray(ids, np.int64)
        self._kept.append((ids[sel], vcodes[sel], values[sel]))

    def _sstd_step(self, vcodes: np.ndarray, values: np.ndarray, bounds: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """SSTD ``process`` in the compiled kernel (of each step in ``bounds``, or of one):
        (score, flagged, positions of the calls to keep)."""
        n = len(vcodes)
        view, loc, c = self.view, self._local, self.config
        score, flagged = np.empty(n), np.empty(n, bool)
        sel, touched = np.empty(n, np.int64), np.empty(n, np.int64)
        status, index, _, kept = _step_kernels.sstd_step(
            len(view), vcodes, values, (view._count, view._mean, view._m2, view._min, view._max),
            (loc._count, loc._mean, loc._m2, loc._min, loc._max),
            self._std, self._cut, self._scratch, touched, score, flagged, sel, float(c.sigma), int(c.min_count),
            self.mature, self.near, self.keep, bounds)
        if status:  # the view numbers every function it is given: a bug, not bad input
            raise RuntimeError(f"call {index}: view code {int(vcodes[index])} outside the view's {len(view)} functions")
        return score, flagged, sel[:kept]

    def _hbos_step(self, vcodes: np.ndarray, values: np.ndarray, bounds: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """HBOS ``process`` in the compiled kernel (of each step in ``bounds``, or of one):
        (score, flagged, positions of the calls to keep)."""
        n = len(vcodes)
        view, loc, c = self.view, self._local, self.config
        score, flagged, keys = np.empty(n), np.empty(n, bool), np.empty(n, np.int64)
        sel, touched = np.empty(n, np.int64), np.empty(n, np.int64)
        status, index, _, kept = _step_kernels.hbos_step(
            len(view), vcodes, values, (view._count, view._mean, view._m2, view._min, view._max),
            (loc._count, loc._mean, loc._m2, loc._min, loc._max),
            view._hist, _FINE_REP, self._scratch, touched, keys, score, flagged, sel, int(c.max_bins),
            float(c.alpha), float(c.threshold), int(c.min_count), self.mature, self.rare, self.keep, bounds)
        if status:
            raise RuntimeError(f"call {index}: view code {int(vcodes[index])} outside the view's {len(view)} functions")
        self._pending.append(keys)  # the local histogram's increments, applied when they are needed
        return score, flagged, sel[:kept]

    def final(self, model: FunctionModel | None = None) -> np.ndarray:
        """The ids of the kept calls that ``model`` (default: this detector's view) flags (needs ``keep``)."""
        if not self.keep:
            raise ValueError("Detector(keep=False) keeps no calls to judge again")
        model = self.view if model is None else model
        if not self._kept:
            return np.zeros(0, np.int64)
        ids, codes, values = (np.concatenate(x) for x in zip(*self._kept))
        self._kept = [(ids, codes, values)]
        mapped = model.codes(self.view.names)[codes] if model is not self.view else codes
        return ids[scorer(model, self.config).score(mapped, values)[1]]

    @property
    def kept(self) -> int:
        """Calls kept to be judged again."""
        return sum(len(k[0]) for k in self._kept)

    def _reset_local(self, rows: np.ndarray) -> None:
        loc = self._local
        loc._count[rows], loc._mean[rows], loc._m2[rows] = 0, 0.0, 0.0
        loc._min[rows], loc._max[rows] = np.inf, -np.inf
        if loc.histograms and self._hist_flushed:
            loc._hist[rows] = 0
            self._hist_flushed = False

    def _flush_pending(self, direct: bool = True) -> None:
        """Put the pending histogram increments in the local histogram (and with ``direct``, note that the
        caller may update it directly)."""
        if self._pending:
            add_at(self._local._hist, np.concatenate(self._pending))
            self._pending = []
            self._hist_flushed = True
        self._hist_flushed |= direct

    def take_local(self) -> FunctionModel:
        """The statistics gathered since the last call, and start afresh."""
        self._flush_pending()
        rows = np.flatnonzero(self._local.count)
        out = self._local.subset(rows)
        self._reset_local(rows)
        return out

    def set_global(self, model: FunctionModel) -> None:
        """Adopt a new global model (which includes every local update already sent)."""
        self._flush_pending()
        self.view = model.merge(self._local)
        self._local = self._aligned(self._local)
        self._hist_flushed = True
        self._names_src, self._server = None, None  # the view's numbering changed
        self._std, self._cut = np.zeros(0), np.zeros(0)
        self._to_server = np.zeros(0, np.int64)
        self._grown()
        self._refresh(np.arange(len(self.view)))

    def sync(self, server: ParameterServer) -> None:
        """Send local statistics to ``server`` and take back the global statistics of the functions that
        changed since this detector's last sync (its view is then the global model). Functions are numbered
        with the server once; after that only arrays travel."""
        if server is not self._server:  # a new server: number every function with it
            self._server, self._server_known, self._who = server, 0, server.join()
            self._to_server[:] = -1
            self._from_server = np.zeros(0, np.int64)
            self.synced_version = 0
        if self.compiled and self._sync_compiled(server):
            return
        loc, view = self._local, self.view
        rows = np.flatnonzero(loc.count)
        new = rows[self._to_server[rows] < 0]
        if len(new):
            self._to_server[new] = server.codes([view.names[i] for i in new.tolist()], view.histograms)
        stats = tuple(getattr(loc, a)[rows] for a in _STATS)
        hist = None
        if view.histograms:
            keys = np.concatenate(self._pending) if self._pending else np.zeros(0, np.int64)
            weights = np.ones(len(keys), np.int64)
            self._pending = []
            if self._hist_flushed:  # counts put in the local histogram directly (``local.update``)
                r, cell = np.nonzero(loc._hist[rows])
                keys = np.concatenate([keys, rows[r] * FINE_BINS + cell])
                weights = np.concatenate([weights, loc._hist[rows][r, cell]])
            # one key per call, not summed per cell: every receiver adds them with ``add_at`` (cheaper than a sort)
            hist = (self._to_server[keys // FINE_BINS] * FINE_BINS + keys % FINE_BINS, weights)
        version, names, changed, gstats, ghist, others = server.exchange_rows(
            self._who, self._to_server[rows], stats, hist, self.synced_version, self._server_known)
        if names:  # server numbers this detector has not mapped yet
            self._map_server_names(names)
        vrows = self._from_server[changed]
        for a, g in zip(_STATS, gstats):
            getattr(view, a)[vrows] = g
        if ghist is not None:
            view._hist[vrows] = ghist
        if others is not None and len(others[0]):
            k = others[0]
            add_at(view._hist, self._from_server[k // FINE_BINS] * FINE_BINS + k % FINE_BINS, others[1])
        self._reset_local(rows)
        self.synced_version = version
        if not self._hist:
            self._refresh(vrows)

    def _map_server_names(self, names: list[str]) -> None:
        """Map the server's functions numbered from ``self._server_known`` on (``names``) to view codes."""
        vc = self.view.codes(names)
        self._grown()
        k = self._server_known + len(names)
        if len(self._from_server) < k:
            self._from_server = np.concatenate([self._from_server,
                                                np.full(max(k, 2 * len(self._from_server)) -
                                                        len(self._from_server), -1, np.int64)])
        self._from_server[self._server_known:k] = vc
        self._to_server[vc] = np.arange(self._server_known, k)
        self._server_known = k

    def _name_with(self, server: ParameterServer) -> bool:
        """Number with ``server`` the functions with local calls it has no number for, and map the functions
        it numbered since this detector last looked (what ``sync`` does around ``exchange_rows``); True if there
        was any."""
        rows = np.flatnonzero(self._local._count[:len(self.view)])
        new = rows[self._to_server[rows] < 0]
        if len(new):
            self._to_server[new] = server.codes([self.view.names[i] for i in new.tolist()], self.view.histograms)
        with server.lock:
            names = server.model.names[self._server_known:]
        if names:
            self._map_server_names(names)
        return bool(len(new) or names)

    def _sync_compiled(self, server: ParameterServer) -> bool:
        """``sync`` through :meth:`ParameterServer.exchange_moments` (no per-function arrays built), naming new
        functions first if that is what it refused for; False, having exchanged nothing, where it does not apply
        (then ``sync`` takes ``exchange_rows``)."""
        self._grown()
        if self._hist:
            return self._sync_compiled_hbos(server)
        c = self.config
        for attempt in range(2):
            if attempt and not self._name_with(server):
                return False
            loc, view, n = self._local, self.view, len(self.view)
            res = server.exchange_moments(
                self._who, (loc._count[:n], loc._mean[:n], loc._m2[:n], loc._min[:n], loc._max[:n]),
                self._to_server, self.synced_version, self._server_known, self._from_server,
                (view._count, view._mean, view._m2, view._min, view._max),
                refresh=(self._std, self._cut, float(c.sigma), int(c.min_count), self.mature, self.near))
            if res is not None:
                self.synced_version = res[0]
                return True
        return False

    def _sync_compiled_hbos(self, server: ParameterServer) -> bool:
        if self.synced_version == 0:  # the first exchange takes whole histogram rows
            return False
        self._name_with(server)
        loc, view, n = self._local, self.view, len(self.view)
        rows = np.flatnonzero(loc._count[:n])
        keys = np.concatenate(self._pending) if self._pending else np.zeros(0, np.int64)
        weights = np.ones(len(keys), np.int64)
        if self._hist_flushed:
            r, cell = np.nonzero(loc._hist[rows])
            keys = np.concatenate([keys, rows[r] * FINE_BINS + cell])
            weights = np.concatenate([weights, loc._hist[rows][r, cell]])
        hist = (self._to_server[keys // FINE_BINS] * FINE_BINS + keys % FINE_BINS, weights)
        res = server.exchange_moments(
            self._who, (loc._count[:n], loc._mean[:n], loc._m2[:n], loc._min[:n], loc._max[:n]), self._to_server,
            self.synced_version, self._server_known, self._from_server,
            (view._count, view._mean, view._m2, view._min, view._max), hist=hist)
        if res is None:
            return False
        version, others = res
        self._pending = []
        if len(others[0]):
            k = others[0]
            add_at(view._hist, self._from_server[k // FINE_BINS] * FINE_BINS + k % FINE_BINS, others[1])
        if self._hist_flushed:  # as _reset_local
            loc._hist[rows] = 0
            self._hist_flushed = False
        self.synced_version = version
        return True


#: logs category of a post-pruning verdict: the final model no longer flags an anomaly recorded online
PRUNED = "anomaly-pruned"


def unpruned_anomalies(run) -> "pa.Table":
    """A run's anomalies table without the online anomalies that post-pruning withdrew (their ``logs`` rows
    of category :data:`PRUNED` name the task key and start)."""
    import json

    import pyarrow as pa

    table = run.arrow("anomalies")
    logs = run.sql(f"SELECT task_key, attrs FROM logs WHERE category = '{PRUNED}'")
    pruned = {(k, json.loads(a)["start_ns"]) for k, a in zip(logs["task_key"], logs["attrs"])}
    if not pruned or not table.num_rows:
        return table
    keep = [(k, s) not in pruned for k, s in zip(table["task_key"].to_pylist(), table["start_ns"].to_pylist())]
    return table.filter(pa.array(keep))

