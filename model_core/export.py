"""Write an AttentionTrace as .npz or .json with the documented keys (float32, batch dropped)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from model_core.trace import AttentionTrace

EXPORT_KEYS = ("tokens", "token_type_ids", "attentions", "scores", "masked_scores", "mask",
               "hidden_states", "queries", "keys")
WORD_KEYS = ("words", "word_attentions", "word_spans")


def word_arrays(trace: AttentionTrace) -> dict[str, np.ndarray]:
    """The word-level keys: ``words``, ``word_attentions`` (layer, head, q_word, k_word) float32 merged by
    Clark et al.'s rule (see ``model_core.words``), and ``word_spans`` (word, 2): start and end piece, end excluded.
    """
    from model_core.words import word_spans

    words = word_spans(trace.tokens)
    return {"words": np.array(words.words, dtype=str), "word_attentions": words.merge(trace.attentions),
            "word_spans": words.array()}


def trace_arrays(trace: AttentionTrace, *, words: bool = False) -> dict[str, np.ndarray]:
    """The export keys as numpy arrays: float32 tensors, ``tokens`` as strings, ``mask`` as 0/1 float32.

    With ``words``, also the word-level keys of ``word_arrays``.
    """
    return {**_piece_arrays(trace), **(word_arrays(trace) if words else {})}


def _piece_arrays(trace: AttentionTrace) -> dict[str, np.ndarray]:
    """The piece-level export keys (``EXPORT_KEYS``)."""
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


def trace_to_npz_bytes(trace: AttentionTrace, *, words: bool = False) -> bytes:
    """The trace as compressed .npz bytes (for a download button or a file)."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **trace_arrays(trace, words=words))
    return buffer.getvalue()


def _jsonable(value: np.ndarray):
    if value.dtype.kind == "f":
        # JSON has no -inf: masked scores are written as null.
        obj = value.astype(object)
        obj[~np.isfinite(value)] = None
        return obj.tolist()
    return value.tolist()


def trace_to_json(trace: AttentionTrace, *, words: bool = False) -> str:
    """The trace as JSON text; -inf (masked scores) becomes null."""
    payload = {key: _jsonable(arr) for key, arr in trace_arrays(trace, words=words).items()}
    payload["description"] = trace.description
    payload["sentence_b_start"] = trace.sentence_b_start
    return json.dumps(payload)


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
