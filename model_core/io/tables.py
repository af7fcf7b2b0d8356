"""The one CSV writer: labelled matrices (token x token ones numbered by position), layer x head grids, rows.

Every number is written in the shortest form that reads back to the same value in its own precision
(float32 stays float32); NaN is an empty cell and -inf is written as -inf.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def _cell(value: Any) -> Any:
    if isinstance(value, float) and not isinstance(value, np.floating):
        value = np.float64(value)
    if isinstance(value, np.floating):
        return "" if np.isnan(value) else str(value)
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    return value


def matrix_to_csv(matrix: np.ndarray, row_labels: Sequence[str] | None = None,
                  col_labels: Sequence[str] | None = None, *, corner: str = "") -> str:
    """A 2-D matrix as CSV text: a header row of column labels, then one row per label.

    Labels default to 0, 1, 2, …; ``corner`` is the header's first cell.

    Shape: matrix (rows, cols).
    """
    matrix = np.asarray(matrix)
    if matrix.ndim != 2:
        raise ValueError(f"matrix_to_csv takes a 2-D array, got shape {matrix.shape}.")
    rows = list(row_labels) if row_labels is not None else [str(i) for i in range(matrix.shape[0])]
    cols = list(col_labels) if col_labels is not None else [str(j) for j in range(matrix.shape[1])]
    if len(rows) != matrix.shape[0] or len(cols) != matrix.shape[1]:
        raise ValueError(f"{len(rows)} row and {len(cols)} column labels for a matrix of shape {matrix.shape}.")
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([corner, *cols])
    for label, values in zip(rows, matrix, strict=True):
        writer.writerow([label, *(_cell(v) for v in values)])
    return buffer.getvalue()


def position_labels(tokens: Sequence[str], positions: Sequence[int] | None = None) -> list[str]:
    """Each token prefixed with its position in the input, as the heatmaps show it ("1:time"), so repeated
    tokens stay distinct. ``positions`` default to 0, 1, 2, …; pass them when a matrix leaves positions out
    (e.g. [CLS] and [SEP] hidden)."""
    positions = range(len(tokens)) if positions is None else list(positions)
    if len(positions) != len(tokens):
        raise ValueError("row_positions and col_positions need one position per label.")
    return [f"{i}:{t}" for i, t in zip(positions, tokens)]


def token_matrix_to_csv(matrix: np.ndarray, row_tokens: Sequence[str], col_tokens: Sequence[str], *,
                        row_positions: Sequence[int] | None = None,
                        col_positions: Sequence[int] | None = None) -> str:
    """A query x key matrix as CSV, every row and column labelled "position:token".

    Shape: matrix (q_pos, k_pos).
    """
    return matrix_to_csv(matrix, position_labels(row_tokens, row_positions), position_labels(col_tokens, col_positions),
                         corner="query \\ key")


def grid_to_csv(grid: np.ndarray) -> str:
    """A (layer, head) grid as CSV, rows "layer 0", …, columns "head 0", ….

    Shape: (layer, head).
    """
    grid = np.asarray(grid)
    return matrix_to_csv(grid, [f"layer {i}" for i in range(grid.shape[0])],
                         [f"head {j}" for j in range(grid.shape[1])])


def rows_to_csv(rows: Sequence[Mapping[str, Any]]) -> str:
    """A list of dicts (e.g. ``HeadStats.to_rows()``) as CSV; the first row's keys are the header."""
    if not rows:
        return ""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _cell(v) for k, v in row.items()})
    return buffer.getvalue()
