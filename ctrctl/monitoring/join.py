"""Join ``ctrctl serve``'s request log with labels that arrive later.

The log holds one Parquet row per scored row (:mod:`ctrctl.serving.request_log`): rows of a
request are consecutive and in request order, so a row's position within its request is its
``row``. Labels come as ``(request_id, row, label)``. The join is an inner join on
``(request_id, row)``; a label whose row was never logged, and a logged row without a label,
are counted, not guessed.

Example:
    >>> joined, counts = join_labels(read_request_log("logs"), pq.read_table("clicks.parquet"))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ctrctl.errors import DatasetError

__all__ = ["LABEL_COLUMNS", "join_labels", "read_request_log"]

LABEL_COLUMNS = ("request_id", "row", "label")


def read_request_log(folder: str | Path) -> pa.Table:
    """Every row of a request log folder, in the order written, with its ``row`` index
    within its request."""
    folder = Path(folder)
    files = sorted(p for p in folder.glob("requests-*.parquet") if p.is_file())
    if not files:
        raise DatasetError("no request log files (requests-*.parquet)", where=str(folder),
                           hint="serve with --log-dir and pass that folder")
    table = pa.concat_tables([pq.read_table(f) for f in files], promote_options="default")
    ids = table.column("request_id").to_pylist()
    rows: list[int] = []
    seen: dict[str, int] = {}
    for request_id in ids:
        at = seen.get(request_id, 0)
        rows.append(at)
        seen[request_id] = at + 1
    return table.append_column("row", pa.array(rows, pa.int64()))


def join_labels(log: pa.Table, labels: pa.Table) -> tuple[pa.Table, dict[str, Any]]:
    """Logged rows with their labels (inner join on request_id and row).

    Returns:
        The joined table (the log's columns plus ``label``), and counts: ``logged``,
        ``labels``, ``joined``, ``unlabelled`` (logged rows without a label) and
        ``unmatched_labels`` (labels of rows not in the log).

    Raises:
        DatasetError: the labels lack a column or repeat a (request_id, row).
    """
    missing = [c for c in LABEL_COLUMNS if c not in labels.column_names]
    if missing:
        raise DatasetError(f"the labels lack columns {missing}", where="--labels",
                           hint="write request_id (string), row (int) and label (0/1)")
    labels = labels.select(list(LABEL_COLUMNS)).cast(pa.schema([
        ("request_id", pa.string()), ("row", pa.int64()), ("label", pa.int8())]))
    keys = pc.binary_join_element_wise(labels.column("request_id"),
                                       pc.cast(labels.column("row"), pa.string()), "\x1f")
    if pc.count_distinct(keys).as_py() != labels.num_rows:
        raise DatasetError("the labels name a (request_id, row) more than once",
                           where="--labels", hint="keep one label per scored row")
    joined = log.join(labels, ["request_id", "row"], join_type="inner")
    counts = {"logged": log.num_rows, "labels": labels.num_rows, "joined": joined.num_rows,
              "unlabelled": log.num_rows - joined.num_rows,
              "unmatched_labels": labels.num_rows - joined.num_rows}
    # arrow's hash join gives no order: back to the log's
    return joined.sort_by([("time", "ascending"), ("request_id", "ascending"),
                           ("row", "ascending")]), counts
