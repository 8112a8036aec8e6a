"""A set of string ids, each with a row, looked up a whole array at a time (the data-state checks and the online
critical path both map ids to rows this way)."""

from __future__ import annotations

import numpy as np

__all__ = ["IdSet", "hash_ids"]


def hash_ids(ids: np.ndarray) -> np.ndarray:
    import pandas as pd  # here: a collector imports this module at start, and hashes ids only for some batches

    return pd.util.hash_array(ids, categorize=False) if len(ids) else np.empty(0, dtype=np.uint64)


class IdSet:
    """Ids with a row each, looked up a whole array at a time: 64-bit hashes kept sorted (a hash join by
    binary search), every match confirmed on the string itself, so a hash collision never confuses two ids."""

    def __init__(self) -> None:
        self.ids = np.empty(0, dtype=object)              # row -> id, in insertion order
        self._h = np.empty(0, dtype=np.uint64)            # sorted hashes
        self._row = np.empty(0, dtype=np.int64)           # row of each sorted hash

    def __len__(self) -> int:
        return len(self.ids)

    def lookup(self, keys: np.ndarray, hashes: np.ndarray | None = None) -> np.ndarray:
        """The row of each key, -1 where unknown."""
        out = np.full(len(keys), -1, dtype=np.int64)
        if not len(keys) or not len(self.ids):
            return out
        h = hash_ids(keys) if hashes is None else hashes
        pos = np.searchsorted(self._h, h)
        hit = self._h[np.minimum(pos, len(self._h) - 1)] == h
        rows = self._row[np.minimum(pos, len(self._h) - 1)]
        same = np.zeros(len(keys), dtype=bool)
        same[hit] = self.ids[rows[hit]] == keys[hit]
        out[same] = rows[same]
        for i in np.flatnonzero(hit & ~same):             # a collision: look through every id with that hash
            j = pos[i]
            while j < len(self._h) and self._h[j] == h[i]:
                if self.ids[self._row[j]] == keys[i]:
                    out[i] = self._row[j]
                    break
                j += 1
        return out

    def add(self, keys: np.ndarray, hashes: np.ndarray | None = None) -> None:
        """Append ids (not known yet, distinct) as the next rows."""
        if not len(keys):
            return
        h = hash_ids(keys) if hashes is None else hashes
        order = np.argsort(h, kind="stable")
        h, rows = h[order], order.astype(np.int64) + len(self.ids)
        at = np.searchsorted(self._h, h)
        self._h = np.insert(self._h, at, h)
        self._row = np.insert(self._row, at, rows)
        self.ids = np.concatenate([self.ids, keys])
