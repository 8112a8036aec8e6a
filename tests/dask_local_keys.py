"""A legacy Dask graph whose keys take every form Dask accepts (tuples, strings shaped like the text of a tuple or of
an object, text that JSON escapes, non-ASCII text, bytes, int and float keys, a tuple key and a string key that share
a name) and whose tasks return results of several kinds; and a graph with a task that raises. Importable, so that the
processes scheduler's worker processes find the functions."""

from __future__ import annotations


def inc(x):
    return x + 1


def add(a, b):
    return a + b


def as_list(x):
    return list(range(x % 5))


def as_text(x):
    return "t" * x


def total(*xs):
    return sum(x if isinstance(x, int) else len(x) for x in xs)


def fail(x):
    raise KeyError(f"task failed on {x}")


def graph() -> tuple[dict, list]:
    """(graph, the keys to compute)."""
    dsk = {
        ("inc", 0): (inc, 1),
        ("inc", 1): (inc, ("inc", 0)),
        ("x-1", 0): (inc, 2),
        "x-1": (add, ("inc", 1), ("x-1", 0)),          # a string key named like the tuple key's first item
        "load-3": (as_list, 3),
        "(weird, 'key')": (inc, 4),                    # text that looks like a tuple
        "<Foo.bar object at 0x1>": (as_text, 5),       # text that looks like an object's repr
        'say "hi"\\-7': (inc, 6),                      # quotes and a backslash: JSON escapes them
        "ключ-1": (inc, 7),                            # non-ASCII
        ("nested", (1, 2)): (inc, 8),                  # a tuple inside a tuple key
        ("finalize-abc", 3, 1): (inc, 9),
        b"bytes-key": (inc, 10),
        42: (inc, 11),
        1.5: (inc, 12),
        "": (inc, 13),                                 # the empty key
    }
    keys = list(dsk)
    dsk["total"] = (total, *keys)
    return dsk, ["total"]


def failing_graph() -> tuple[dict, list]:
    """A graph with a task that raises (``KeyError``) after one that returns."""
    return {"ok-1": (inc, 1), ("bad", 0): (fail, "ok-1"), "after-1": (inc, ("bad", 0))}, ["after-1"]
