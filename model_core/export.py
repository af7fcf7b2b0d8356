"""Write an AttentionTrace as .npz or .json with the documented keys (float32, batch dropped)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from model_core.trace import AttentionTrace

EXPORT_KEYS = ("tokens", "token_type_ids", "attentions", "scores", "masked_scores", "mask",
               "hidden_states", "queries", "keys")


def trace_arrays(trace: AttentionTrace) -> dict[str, np.ndarray]:
    """The export keys as numpy arrays: float32 tensors, ``tokens`` as strings, ``mask`` as 0/1 float32."""
    return {
        "tokens": np.array(trace.tokens, dtype=str),
        "token_type_ids": trace.token_type_ids.astype(np.int64),
        "attentions": trace.attentions.astype(np.float32),
        "scores": trace.scores.astype(np.float32),
        "masked_scores": trace.masked_scores.astype(np.float32),
        "mask": trace.mask.astype(np.float32),
        "hidden_states": trace.hidden_states.astype(np.float32),
        "queries": trace.queries.astype(np.float32),
        "keys": trace.keys.astype(np.float32),
    }


def trace_to_npz_bytes(trace: AttentionTrace) -> bytes:
    """The trace as compressed .npz bytes (for a download button or a file)."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **trace_arrays(trace))
    return buffer.getvalue()


def _jsonable(value: np.ndarray):
    if value.dtype.kind == "f":
        # JSON has no -inf: masked scores are written as null.
        obj = value.astype(object)
        obj[~np.isfinite(value)] = None
        return obj.tolist()
    return value.tolist()


def trace_to_json(trace: AttentionTrace) -> str:
    """The trace as JSON text; -inf (masked scores) becomes null."""
    payload = {key: _jsonable(arr) for key, arr in trace_arrays(trace).items()}
    payload["description"] = trace.description
    payload["sentence_b_start"] = trace.sentence_b_start
    return json.dumps(payload)


def write_trace(trace: AttentionTrace, path: str | Path) -> Path:
    """Write ``trace`` to ``path``; the suffix (.npz or .json) picks the format.

    Raises:
        ValueError: the suffix is neither .npz nor .json.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        path.write_bytes(trace_to_npz_bytes(trace))
    elif suffix == ".json":
        path.write_text(trace_to_json(trace), encoding="utf-8")
    else:
        raise ValueError(f"--out {str(path)!r} must end in .npz or .json.")
    return path


def matrix_to_csv(matrix: np.ndarray, row_labels: list[str] | tuple[str, ...],
                  col_labels: list[str] | tuple[str, ...]) -> str:
    """A labelled matrix as CSV text (first column: row label; header: column labels).

    Labels are prefixed with their position so repeated tokens stay distinct; -inf is written as -inf.
    Shape: matrix (rows, cols).
    """
    import csv

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["query \\ key", *[f"{j}:{c}" for j, c in enumerate(col_labels)]])
    for i, (label, row) in enumerate(zip(row_labels, np.asarray(matrix))):
        writer.writerow([f"{i}:{label}", *[f"{v:.6g}" for v in row]])
    return buffer.getvalue()
