"""The interval arithmetic under the advisor's makespan attribution, against a point-by-point count."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from flowscope.analysis.advisor.attribution import _merge, _overlaps

intervals = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 12)).map(lambda p: (p[0], p[0] + p[1])),
                     max_size=12)


def _points(iv) -> set[int]:
    return {x for s, e in iv for x in range(s, e)}


@settings(max_examples=300, deadline=None)
@given(intervals)
def test_merge_is_the_union_sorted_disjoint_and_joins_touching_intervals(iv):
    got = _merge(np.array(iv, dtype=np.int64).reshape(-1, 2))
    assert _points(map(tuple, got)) == _points(iv)
    assert all(s <= e for s, e in got)
    # sorted, and neither overlapping nor touching (touching ones are one interval)
    assert all(got[i][1] < got[i + 1][0] for i in range(len(got) - 1))
    non_empty = [(s, e) for s, e in iv if e > s]
    if non_empty:
        assert got[0][0] == min(s for s, _ in iv)


@settings(max_examples=300, deadline=None)
@given(intervals, st.lists(st.tuples(st.integers(-5, 80), st.integers(-5, 80)), min_size=1, max_size=8))
def test_overlaps_counts_the_covered_length_of_each_window(iv, windows):
    merged = _merge(np.array(iv, dtype=np.int64).reshape(-1, 2))
    s = np.array([w[0] for w in windows], dtype=np.int64)
    e = np.array([w[1] for w in windows], dtype=np.int64)
    covered = _points(iv)
    expected = [len(covered & set(range(a, b))) for a, b in windows]
    assert _overlaps(merged, s, e).tolist() == expected
