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
        # every change as (server code, update), in update order, so that a detector's sync finds the functions
        # changed since its last one without a pass over all of them (a function's older entries are dropped)
        self._clog = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(1, np.int64))
        self._origin: tuple = (None, np.zeros(0, np.int64))  # (list, position of each server function in it)
        self._log_slack = 65536  # entries beyond 4 per function before the log is trimmed
        if len(self.model):
            self._log_changes(np.arange(len(self.model)), self.updates)

    def _log_room(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The change log, with room for ``k`` more entries."""
        codes, ver, n = self._clog
        if len(codes) < int(n[0]) + k:
            cap = max(int(n[0]) + k, 2 * len(codes), 64)
            c2, v2 = np.empty(cap, np.int64), np.empty(cap, np.int64)
            c2[:n[0]], v2[:n[0]] = codes[:n[0]], ver[:n[0]]
            self._clog = (c2, v2, n)
        return self._clog

    def _log_changes(self, codes: np.ndarray, version: int) -> None:
        codes = np.asarray(codes, np.int64)
        lc, lv, n = self._log_room(len(codes))
        k = int(n[0])
        lc[k:k + len(codes)], lv[k:k + len(codes)] = codes, version
        n[0] = k + len(codes)

    def _trim_log(self) -> None:
        """Keep only each function's latest change-log entry (all that "changed after version v" needs), once
        the log is four times as long as the model (plus a margin): amortised O(1) per entry."""
        lc, lv, n = self._clog
        k = int(n[0])
        if k <= 4 * len(self.model) + self._log_slack:
            return
        codes = lc[:k]
        latest = np.empty(int(codes.max()) + 1, np.int64)
        latest[codes] = np.arange(k)  # (numpy assigns repeated indices in order: the last entry of each code wins)
        pick = np.flatnonzero(latest[codes] == np.arange(k))  # in log (= update) order
        m = len(pick)
        lc[:m], lv[:m] = codes[pick], lv[:k][pick]
        n[0] = m

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
            self._log_changes(idx, self.updates)
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

    def codes(self, names: Sequence[str], histograms: bool,
              origin: tuple[Sequence[str], np.ndarray] | None = None) -> np.ndarray:
        """The server's numbers of functions ``names`` (new ones are added, empty), for ``exchange_rows``.
        ``origin`` = (list, positions): each name's position in a list of names detectors were given (-1: none),
        noted so that detectors numbered by the same list map the server's functions without looking names up
        (``origin_positions``)."""
        with self.lock:
            self.model._check_merge(FunctionModel(histograms))  # an empty model takes the detectors' kind
            out = self.model.codes(list(names))
            self._grow_changed()
            if origin is not None and origin[0] is not None:
                src, pos = self._origin
                if src is None:
                    src = origin[0]
                if src is origin[0]:
                    if len(pos) < len(self.model):
                        pos = np.concatenate([pos, np.full(max(len(self.model), 2 * len(pos)) - len(pos), -1,
                                                           np.int64)])
                    fresh = pos[out] < 0
                    pos[out[fresh]] = np.asarray(origin[1], np.int64)[fresh]
                    self._origin = (src, pos)
            return out

    def origin_positions(self, start: int, stop: int, names: Sequence[str]) -> np.ndarray | None:
        """The positions in ``names`` (a list given to ``codes`` as ``origin``) of the server's functions
        ``start:stop`` (-1 where not known), or None if the server's functions were not noted against that list."""
        with self.lock:
            src, pos = self._origin
            if src is not names:
                return None
            out = np.full(stop - start, -1, np.int64)
            got = pos[start:stop]
            out[:len(got)] = got
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
            self._log_changes(codes, self.updates)
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
            self._trim_log()
            return self.updates, m.names[known:], rows, out, rows_hist, others

    def exchange_moments(self, who: int, local: tuple[np.ndarray, ...], to_server: np.ndarray, since: int,
                         known: int, from_server: np.ndarray, view: tuple[np.ndarray, ...],
                         hist: tuple[np.ndarray, np.ndarray] | None = None,
                         refresh: tuple | None = None, local_rows: tuple[np.ndarray, np.ndarray] | None = None,
                         nview: int | None = None) -> tuple[int, tuple[np.ndarray, np.ndarray] | None] | None:
        """:meth:`exchange_rows` for a detector in this process, compiled (``_step_kernels.sync_moments``): merge
        its local moments (``local``: count, mean, M2, min, max per view code, the detector's view size long;
        reset to empty on the way) and write the global moments of every function changed after ``since`` into
        ``view`` (the detector's arrays), with the maps ``to_server`` (view code -> server code) and
        ``from_server`` (server code -> view code, ``known`` long). ``hist`` as in :meth:`exchange_rows` (keys in
        server numbers); ``refresh`` = (std, cut, sigma, min_count, mature, near): SSTD's per-function std and
        keep threshold, recomputed for the functions written. Returns the new version and the other detectors'
        histogram increments since ``since`` (None without histograms), or None, having changed nothing, when
        the detector must take :meth:`exchange_rows` (the server has functions it has not mapped, one of its
        functions has no server number yet, or its first exchange needs whole histogram rows). ``local_rows`` =
        (rows, count): the view codes with local calls (``rows[:count[0]]``; then the others are not looked at, and
        count is set to 0); ``nview``: the functions in the view, if the arrays are longer."""
        with self.lock:
            m = self.model
            if len(m) != known or (hist is not None) != m.histograms or (m.histograms and since == 0):
                return None
            version = self.updates + 1
            std, cut, sigma, min_count, mature, near = refresh or (None, None, 0.0, 0, 0, 0.0)
            lrows, lcount = local_rows or (None, None)
            nv = len(local[0]) if nview is None else nview
            status = _step_kernels.sync_moments(
                nv, local, to_server, len(m),
                (m._count, m._mean, m._m2, m._min, m._max), self._changed, version, since, from_server, view,
                refresh is not None, std, cut, sigma, min_count, mature, near, lrows, lcount,
                self._log_room(nv if local_rows is None else int(lcount[0])))
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
            if self._clog[2][0] > 4 * len(m) + self._log_slack:
                self._trim_log()
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
        # the view codes with local calls since the last sync (the first _nlt[0]), so a sync looks at those only
        self._lt, self._nlt = np.zeros(0, np.int64), np.zeros(1, np.int64)
        # compiled steps append their kept calls here: (ids, view codes, values, count)
        self._kstore = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(1, np.int64))
        self._margs: tuple | None = None  # (view moments, local moments) as the kernels take them
        self._relist_due = False          # the local model was handed out: list its functions again before a sync
        self._follows: tuple = (None, 0)  # (list, n): view codes below n are the positions in that list of names

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
        self._relist_due = True  # the caller may add calls to it directly
        return self._local

    @local.setter
    def local(self, model: FunctionModel) -> None:
        self._flush_pending()
        self._local = self._aligned(model)
        self._hist_flushed = True
        self._grown()
        self._relist()

    def _relist(self) -> None:
        """List the view codes with local calls again (after the local model changed outside the kernels)."""
        rows = np.flatnonzero(self._local._count[:len(self.view)])
        self._lt[:len(rows)] = rows
        self._nlt[0] = len(rows)
        self._relist_due = False

    def _local_rows(self) -> np.ndarray:
        """The view codes with local calls (compiled detectors: from the list the kernels keep, in no order)."""
        if not self.compiled:
            return np.flatnonzero(self._local._count[:len(self.view)])
        if self._relist_due:
            self._relist()
        return self._lt[:int(self._nlt[0])].copy()

    def _moments(self) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
        """(view moments, local moments), the storage arrays as the kernels take them."""
        a, view, loc = self._margs, self.view, self._local
        if a is None or a[0][0] is not view._count or a[1][0] is not loc._count or a[0][3] is not view._min \
                or a[1][3] is not loc._min:
            a = self._margs = ((view._count, view._mean, view._m2, view._min, view._max),
                               (loc._count, loc._mean, loc._m2, loc._min, loc._max))
        return a

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
        if len(self._lt) < len(self._std):
            self._lt = np.concatenate([self._lt, np.zeros(len(self._std) - len(self._lt), np.int64)])
        if len(self._scratch[0]) < len(self._std):
            k = len(self._std)
            self._scratch = (np.zeros(k, np.int64), np.zeros(k), np.zeros(k))

    def _map(self, functions: Sequence[str], func: np.ndarray) -> np.ndarray:
        """View codes of the calls ``func`` (codes into ``functions``); a list seen before (the same object,
        possibly grown by appending) is not looked up again."""
        if functions is not self._names_src:
            self._names_src, self._names_map = functions, self._first_codes(functions)
            self._grown()
        elif len(self._names_map) < len(functions):  # the list grew
            self._names_map = np.concatenate([self._names_map,
                                              self.view.codes(list(functions[len(self._names_map):]))])
            self._grown()
        return self._names_map[func]

    #: (list, its length, its index) the last fresh view was numbered by: other detectors given the same list
    #: (the entries of a list given to ``process`` never change) copy the index instead of hashing every name
    _numbering: tuple = (None, 0, None)

    def _first_codes(self, functions: Sequence[str]) -> np.ndarray:
        """The view codes of a list of names; a fresh view takes the list's own numbering."""
        view = self.view
        if len(view):
            return view.codes(list(functions))
        src, n, index = Detector._numbering
        if src is functions and n == len(functions):
            view._grow(list(functions))
            view.index = dict(index)
            self._follows = (functions, n)
            return np.arange(n, dtype=np.int64)
        codes = view.codes(list(functions))
        if len(view) == len(functions) and len(view.index) == len(functions):  # the list's order, no repeats
            Detector._numbering = (functions, len(functions), dict(view.index))
            self._follows = (functions, len(functions))
        return codes

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
        values = np.ascontiguousarray(values, np.float64)
        if not len(func):
            return np.zeros(0), np.zeros(0, bool)
        vcodes = self._map(functions, func)
        if self.compiled:
            score, flagged = (self._hbos_step if self._hist else self._sstd_step)(vcodes, values, ids)
            self.seen += len(func)
            return score, flagged
        view, loc = self.view, self._local
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
        score, flagged = (self._hbos_step if self._hist else self._sstd_step)(vcodes, values, ids, b)
        self.seen += len(func)
        return score, flagged

    def _keep(self, func: np.ndarray, ids: np.ndarray | None, sel: np.ndarray, vcodes: np.ndarray,
              values: np.ndarray) -> None:
        ids = np.arange(self.seen, self.seen + len(func)) if ids is None else np.asarray(ids, np.int64)
        self._kept.append((ids[sel], vcodes[sel], values[sel]))

    def _kept_room(self, n: int) -> tuple[np.ndarray, ...]:
        """The kept-call store, with room for ``n`` more calls (a full store joins the kept list, uncopied, and a
        new one, twice as large up to 1M calls, takes its place)."""
        ids, codes, values, k = self._kstore
        m = int(k[0])
        if len(ids) < m + n:
            if m:
                self._kept.append((ids[:m], codes[:m], values[:m]))
            cap = max(n, min(2 * len(ids), 1 << 20), 4096)
            self._kstore = (np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap), k)
            k[0] = 0
        return self._kstore

    def _sstd_step(self, vcodes: np.ndarray, values: np.ndarray, ids: np.ndarray | None,
                   bounds: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """SSTD ``process`` in the compiled kernel (of each step in ``bounds``, or of one): (score, flagged); kept
        calls go to the kept-call store."""
        n = len(vcodes)
        c = self.config
        vm, lm = self._moments()
        score, flagged = np.empty(n), np.empty(n, bool)
        status, index, _, _ = _step_kernels.sstd_step(
            len(self.view), vcodes, values, vm, lm, self._std, self._cut, self._scratch, np.empty(n, np.int64),
            score, flagged, None, float(c.sigma), int(c.min_count), self.mature, self.near, self.keep, bounds,
            self._lt, self._nlt, self._kept_room(n) if self.keep else None,
            None if ids is None else np.ascontiguousarray(ids, np.int64), self.seen)
        if status:  # the view numbers every function it is given: a bug, not bad input
            raise RuntimeError(f"call {index}: view code {int(vcodes[index])} outside the view's {len(self.view)} "
                               f"functions")
        return score, flagged

    def _hbos_step(self, vcodes: np.ndarray, values: np.ndarray, ids: np.ndarray | None,
                   bounds: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """HBOS ``process`` in the compiled kernel (of each step in ``bounds``, or of one): (score, flagged); kept
        calls go to the kept-call store."""
        n = len(vcodes)
        view, c = self.view, self.config
        vm, lm = self._moments()
        score, flagged, keys = np.empty(n), np.empty(n, bool), np.empty(n, np.int64)
        status, index, _, _ = _step_kernels.hbos_step(
            len(view), vcodes, values, vm, lm, view._hist, _FINE_REP, self._scratch, np.empty(n, np.int64), keys,
            score, flagged, None, int(c.max_bins), float(c.alpha), float(c.threshold), int(c.min_count),
            self.mature, self.rare, self.keep, bounds, self._lt, self._nlt,
            self._kept_room(n) if self.keep else None,
            None if ids is None else np.ascontiguousarray(ids, np.int64), self.seen)
        if status:
            raise RuntimeError(f"call {index}: view code {int(vcodes[index])} outside the view's {len(view)} functions")
        self._pending.append(keys)  # the local histogram's increments, applied when they are needed
        return score, flagged

    def final(self, model: FunctionModel | None = None) -> np.ndarray:
        """The ids of the kept calls that ``model`` (default: this detector's view) flags (needs ``keep``)."""
        if not self.keep:
            raise ValueError("Detector(keep=False) keeps no calls to judge again")
        model = self.view if model is None else model
        k = int(self._kstore[3][0])
        if k:  # the compiled steps' store joins the list
            self._kept.append(tuple(a[:k] for a in self._kstore[:3]))
            self._kstore = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), self._kstore[3])
            self._kstore[3][0] = 0
        if not self._kept:
            return np.zeros(0, np.int64)
        ids, codes, values = (np.concatenate(x) for x in zip(*self._kept))
        self._kept = [(ids, codes, values)]
        mapped = self._codes_in(model, codes)  # (may add the view's names to ``model``: first)
        return ids[scorer(model, self.config).score(mapped, values)[1]]

    def _codes_in(self, model: FunctionModel, codes: np.ndarray) -> np.ndarray:
        """``model``'s numbers of the view's functions ``codes``: through the server numbering when ``model``
        numbers functions as this detector's server does (a snapshot of it, say), else by name."""
        if model is self.view:
            return codes
        server = self._server
        if server is not None and self._server_known and len(model) >= self._server_known:
            mapped = self._to_server[codes]
            with server.lock:
                same = server.model.names[:self._server_known] == model.names[:self._server_known]
            if same and ((mapped >= 0) & (mapped < self._server_known)).all():
                return mapped
        return model.codes(self.view.names)[codes]

    @property
    def kept(self) -> int:
        """Calls kept to be judged again."""
        return sum(len(k[0]) for k in self._kept) + int(self._kstore[3][0])

    def _reset_local(self, rows: np.ndarray) -> None:
        loc = self._local
        loc._count[rows], loc._mean[rows], loc._m2[rows] = 0, 0.0, 0.0
        loc._min[rows], loc._max[rows] = np.inf, -np.inf
        if loc.histograms and self._hist_flushed:
            loc._hist[rows] = 0
            self._hist_flushed = False
        self._relist()

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
        self._follows = (None, 0)
        self._std, self._cut = np.zeros(0), np.zeros(0)
        self._to_server = np.zeros(0, np.int64)
        self._grown()
        self._relist()
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
            self._to_server[new] = server.codes([view.names[i] for i in new.tolist()], view.histograms,
                                                self._origin_of(new))
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

    def _origin_of(self, vcodes: np.ndarray) -> tuple[Sequence[str] | None, np.ndarray]:
        """(the list this view is numbered by, each view code's position in it or -1), for ``server.codes``."""
        src, n = self._follows
        return src, np.where(vcodes < n, vcodes, -1)

    def _map_server_names(self, names: list[str]) -> None:
        """Map the server's functions numbered from ``self._server_known`` on (``names``) to view codes."""
        src, n = self._follows
        known = self._server_known
        pos = None if src is None else self._server.origin_positions(known, known + len(names), src)
        if pos is None:
            vc = self.view.codes(names)
        else:  # functions noted at a position of the list this view is numbered by: that is their view code
            vc = np.where((pos >= 0) & (pos < n), pos, -1)
            rest = np.flatnonzero(vc < 0)
            if len(rest):
                vc[rest] = self.view.codes([names[i] for i in rest.tolist()])
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
        rows = self._local_rows()
        new = np.sort(rows[self._to_server[rows] < 0])  # numbered with the server in view order
        if len(new):
            self._to_server[new] = server.codes([self.view.names[i] for i in new.tolist()], self.view.histograms,
                                                self._origin_of(new))
        with server.lock:
            names = server.model.names[self._server_known:]
        if names:
            self._map_server_names(names)
        return bool(len(new) or names)

    def _sync_compiled(self, server: ParameterServer) -> bool:
        """``sync`` through :meth:`ParameterServer.exchange_moments` (no per-function arrays built), naming new
        functions first if that is what it refused for; False, having exchanged nothing, where it does not apply
        (then ``sync`` takes ``exchange_rows``)."""
        n = len(self.view.names)
        if len(self._std) < n or len(self._local.names) < n:
            self._grown()
        if self._relist_due:
            self._relist()
        if self._hist:
            return self._sync_compiled_hbos(server)
        for attempt in range(2):
            if attempt and not self._name_with(server):
                return False
            vm, lm = self._moments()
            res = server.exchange_moments(
                self._who, lm, self._to_server, self.synced_version, self._server_known, self._from_server, vm,
                local_rows=(self._lt, self._nlt), nview=len(self.view))
            # (no std / keep threshold refresh: the compiled step recomputes both for every function it judges)
            if res is not None:
                self.synced_version = res[0]
                return True
        return False

    def _sync_compiled_hbos(self, server: ParameterServer) -> bool:
        if self.synced_version == 0:  # the first exchange takes whole histogram rows
            return False
        self._name_with(server)
        loc, view, n = self._local, self.view, len(self.view)
        rows = self._local_rows()
        keys = np.concatenate(self._pending) if self._pending else np.zeros(0, np.int64)
        weights = np.ones(len(keys), np.int64)
        if self._hist_flushed:
            r, cell = np.nonzero(loc._hist[rows])
            keys = np.concatenate([keys, rows[r] * FINE_BINS + cell])
            weights = np.concatenate([weights, loc._hist[rows][r, cell]])
        hist = (self._to_server[keys // FINE_BINS] * FINE_BINS + keys % FINE_BINS, weights)
        vm, lm = self._moments()
        res = server.exchange_moments(
            self._who, lm, self._to_server, self.synced_version, self._server_known, self._from_server, vm,
            hist=hist, local_rows=(self._lt, self._nlt), nview=n)
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

