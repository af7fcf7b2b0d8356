"""The one NPZ/JSON writer (``to_npz_bytes``, ``to_json_str``), and an AttentionTrace written with it as .npz or
.json with the documented keys (float32, batch dropped). CSV is ``model_core.io.tables``."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from model_core.trace.trace import AttentionTrace

EXPORT_KEYS = ("tokens", "token_type_ids", "attentions", "scores", "masked_scores", "mask",
               "hidden_states", "queries", "keys", "kv_heads")
PREDICTION_KEYS = ("next_token_ids", "next_token_probs", "next_token_strings")
"""A decoder's exports also carry its top next-token predictions at every position."""
WORD_KEYS = ("words", "word_attentions", "word_spans")
REPLY_KEY = "reply_start"
"""A generated sequence's export also carries where the reply starts: a 0-d int64, absent for a typed-in text."""


def word_arrays(trace: AttentionTrace) -> dict[str, np.ndarray]:
    """The word-level keys: ``words``, ``word_attentions`` (layer, head, q_word, k_word) float32 merged by
    Clark et al.'s rule (see ``model_core.words``), and ``word_spans`` (word, 2): start and end piece, end excluded.
    """
    words = trace.words()
    return dict(zip(WORD_KEYS, (np.array(words.words, dtype=str), words.merge(trace.weights), words.array())))


def trace_arrays(trace: AttentionTrace, *, words: bool = False) -> dict[str, np.ndarray]:
    """The export keys as numpy arrays: float32 tensors, ``tokens`` as strings, ``mask`` as 0/1 float32.

    With ``words``, also the word-level keys of ``word_arrays``.
    """
    return {**_piece_arrays(trace), **(word_arrays(trace) if words else {})}


def _piece_arrays(trace: AttentionTrace) -> dict[str, np.ndarray]:
    """The piece-level export keys (``EXPORT_KEYS``), and a decoder's ``PREDICTION_KEYS``."""
    predictions = () if trace.next_token_ids is None else (
        trace.next_token_ids.astype(np.int64), trace.next_token_probs.astype(np.float32),
        np.array(trace.next_token_strings, dtype=str))
    return {
        "tokens": np.array(trace.tokens, dtype=str),
        "token_type_ids": trace.token_type_ids.astype(np.int64),
        "attentions": trace.weights.astype(np.float32),
        "scores": trace.scores.astype(np.float32),
        "masked_scores": trace.masked_scores.astype(np.float32),
        "mask": trace.mask.astype(np.float32),
        "hidden_states": trace.hidden_states.astype(np.float32),
        "queries": trace.queries.astype(np.float32),
        "keys": trace.keys.astype(np.float32),
        "kv_heads": trace.kv_heads.astype(np.int64),
        **dict(zip(PREDICTION_KEYS, predictions)),
        **({} if trace.reply_start is None else {REPLY_KEY: np.array(trace.reply_start, dtype=np.int64)}),
    }


def to_npz_bytes(arrays: Mapping[str, Any]) -> bytes:
    """Compressed NPZ file contents holding ``arrays`` (strings become unicode arrays)."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **{name: np.asarray(value) for name, value in arrays.items()})
    return buffer.getvalue()


def to_json_str(data: Mapping[str, Any]) -> str:
    """JSON text of ``data``: arrays become nested lists; NaN and infinities (masked scores' -inf) become null."""
    return json.dumps(_jsonable(data), allow_nan=False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f":  # whole arrays at once: a 512-token trace has millions of numbers
            obj = value.astype(object)
            obj[~np.isfinite(value)] = None
            return obj.tolist()
        return value.tolist() if value.dtype.kind in "biuU" else _jsonable(value.tolist())
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, (np.integer, np.bool_)):
        return value.item()
    return value


def trace_to_npz_bytes(trace: AttentionTrace, *, words: bool = False) -> bytes:
    """The trace as compressed .npz bytes (for a download button or a file)."""
    return to_npz_bytes(trace_arrays(trace, words=words))


def trace_to_json(trace: AttentionTrace, *, words: bool = False) -> str:
    """The trace as JSON text; -inf (masked scores) becomes null."""
    return to_json_str({**trace_arrays(trace, words=words), "description": trace.description,
                        "sentence_b_start": trace.sentence_b_start, REPLY_KEY: trace.reply_start})


def write_trace(trace: AttentionTrace, path: str | Path, *, words: bool = False) -> Path:
    """Write ``trace`` to ``path``; the suffix (.npz or .json) picks the format; ``words`` adds ``WORD_KEYS``.

    Raises:
        ValueError: the suffix is neither .npz nor .json.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".npz":
        path.write_bytes(trace_to_npz_bytes(trace, words=words))
    elif suffix == ".json":
        path.write_text(trace_to_json(trace, words=words), encoding="utf-8")
    else:
        raise ValueError(f"--out {str(path)!r} must end in .npz or .json.")
    return path
