"""Views of many attention numbers at once: the markers' positions, block pooling, aggregates over heads,
and the attention of a selection of tokens."""

from __future__ import annotations

import numpy as np

from model_core.analysis._common import trace_flags
from model_core.words import WordSpans


def marker_positions(trace, words: WordSpans | None = None) -> list[int]:
    """Positions of the family's markers, what "Hide [CLS] and [SEP]" hides: an encoder's [CLS] and [SEP]; a
    decoder's first token and its other special tokens (``model_core.analysis.trace_flags``).

    Args:
        trace: the ``AttentionTrace``.
        words: the trace's words when the views show words: the words holding those pieces are returned.
    """
    flags = trace_flags(trace)
    pieces = np.flatnonzero(flags["cls"] | flags["sep"]).tolist()
    if words is None:
        return pieces
    return sorted({words.word_of(p) for p in pieces})


def pool_matrix(matrix: np.ndarray, size: int, *, sum_keys: bool = False) -> np.ndarray:
    """Pool the last two axes of ``matrix`` into at most ``size`` x ``size`` blocks (no-op when smaller).

    Rows (queries) are averaged. Columns (keys) are averaged too, so a cell is the mean weight of its
    block; or, with ``sum_keys``, summed, so a cell is the share of attention the block's queries give to
    the block's keys, and a row of an attention matrix still sums to 1.

    Shape: (..., n, n) -> (..., m, m), m = min(n, size).
    """
    n = matrix.shape[-1]
    if n <= size:
        return matrix
    edges = np.linspace(0, n, size + 1).round().astype(int)[:-1]
    counts = np.diff(np.append(edges, n))
    rows = np.add.reduceat(matrix, edges, axis=-2) / counts[:, None]
    if sum_keys:
        return np.add.reduceat(rows, edges, axis=-1)
    return np.add.reduceat(rows, edges, axis=-1) / counts[None, :]


AGGREGATES = ("head", "layer_mean", "layer_max", "all_mean")


def aggregate_heads(attentions: np.ndarray, how: str, layer: int = 0, head: int = 0) -> np.ndarray:
    """One head's matrix, or an aggregate of many: the mean or the maximum over a layer's heads, or the
    mean over every layer and head. A mean's rows still sum to 1; a maximum's need not.

    Shape: attentions (layer, head, q_pos, k_pos) -> (q_pos, k_pos).
    """
    if how == "head":
        return attentions[layer, head]
    if how == "layer_mean":
        return attentions[layer].mean(axis=0, dtype=np.float64).astype(np.float32)
    if how == "layer_max":
        return attentions[layer].max(axis=0)
    if how == "all_mean":
        return attentions.mean(axis=(0, 1), dtype=np.float64).astype(np.float32)
    raise ValueError(f"how must be one of {', '.join(AGGREGATES)}, not {how!r}.")


def selection_attention(attentions: np.ndarray, selected: list[int], direction: str = "sent") -> np.ndarray:
    """For every layer and head, the attention of a set of tokens.

    ``"sent"``: how much the selection sends to each token, the mean of the selected rows (sums to 1).
    ``"received"``: how much each token sends to the selection, the sum of the selected columns.

    Shape: attentions (layer, head, q_pos, k_pos) -> (layer, head, pos).
    """
    selected = sorted({int(i) for i in selected})
    n = attentions.shape[-1]
    if not selected or not all(0 <= i < n for i in selected):
        raise ValueError(f"Select at least one token, at positions 0-{n - 1}.")
    if direction == "sent":
        return attentions[:, :, selected, :].mean(axis=2, dtype=np.float64).astype(np.float32)
    if direction == "received":
        return attentions[:, :, :, selected].sum(axis=3, dtype=np.float64).astype(np.float32)
    raise ValueError(f"direction must be 'sent' or 'received', not {direction!r}.")
