"""The canonical tables as the path builders read them: a DataFrame or an Arrow table in, its required columns
checked (ValueError naming the table and the columns), attrs JSON decoded, missing values as None."""

from __future__ import annotations

import json
from typing import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa


def _frame(t: pd.DataFrame | pa.Table, name: str, required: Iterable[str]) -> pd.DataFrame:
    df = t.to_pandas() if isinstance(t, pa.Table) else t
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{name}: expected a pandas DataFrame or a pyarrow Table, got {type(t).__name__}")
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"{name}: missing column(s) {', '.join(missing)}; has {', '.join(map(str, df.columns))}")
    return df


def _attrs(text) -> dict:
    if text is None or (isinstance(text, float) and np.isnan(text)) or text is pd.NA:
        return {}
    try:
        v = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return v if isinstance(v, dict) else {}


def _opt(v):
    return None if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)) else v
