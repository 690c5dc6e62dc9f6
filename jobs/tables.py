"""What every task's `summarize(rows)` shares: the rows' type, their checks, grouping, CSV and PNG bytes.

A trial reports its table rows as the `table` metric (a `TableRows`); the worker concatenates every trial's
rows and calls the task's `summarize(rows)`, which returns artifact file name -> bytes for the parent run.
Each task keeps what is its own (which columns, which statistics, which picture); this module holds only what
was repeated: the rows' short repr, the "got no rows" / "rows lack" errors, grouping by key columns, mean ±
sample std, a CSV (NaN as an empty cell), a Markdown table and a Matplotlib figure as PNG bytes.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any


class TableRows(list):  # type: ignore[type-arg]
    """A trial's table rows: a plain list to JSON, pickle and `table_rows`, with a short repr, because Tune's
    TensorBoard logger warns about a non-numeric metric by printing its value (~250 kB for 972 rows)."""

    def __repr__(self) -> str:
        return f"<{len(self)} rows>"


def check_rows(rows: Sequence[dict[str, Any]], columns: Iterable[str], task: str) -> None:
    """Raise ValueError when there are no rows or the first lacks one of `columns` (the task's row schema)."""
    if not rows:
        raise ValueError("summarize: got no rows; pass the `table` metric of each finished trial, concatenated")
    missing = [k for k in columns if k not in rows[0]]
    if missing:
        raise ValueError(f"summarize: rows lack {', '.join(missing)}; expected the `table` rows of {task}")


def group_rows(rows: Iterable[dict[str, Any]], keys: Sequence[str]) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """Rows grouped by their values of `keys`, groups in first-seen order (lists become tuples: hashable)."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        key = tuple(tuple(v) if isinstance(v, list) else v for v in (r.get(k) for k in keys))
        groups.setdefault(key, []).append(r)
    return groups


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1) over seeds; NaN where there are too few values for either."""
    mean = statistics.fmean(values) if values else math.nan
    return mean, statistics.stdev(values) if len(values) >= 2 else math.nan


def csv_bytes(columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> bytes:
    """A CSV of `columns` (other keys ignored, missing ones empty); NaN (no seed, or one seed for a std) is an
    empty cell, so a spreadsheet reads the column as numbers."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: "" if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in rows)
    return buf.getvalue().encode()


def markdown_table(header: Sequence[str], lines: Iterable[Sequence[Any]]) -> str:
    """A GitHub Markdown table; cells are str()-ed, so format numbers before."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in line) + " |" for line in lines]
    return "\n".join(out) + "\n"


def png_bytes(fig: Any, dpi: int = 90) -> bytes:
    """A Matplotlib `Figure` (built without pyplot: no global state, safe in a worker thread) as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()
