"""What a generated token looked at: when the model wrote the token at position p, its last pass read the query at
p - 1, so that query's attention over positions 0..p-1 is what it attended to, for one head, the mean of a layer's
heads, or the mean of every head of every layer. Read from a full trace or exactly from a compact one."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

How = Literal["head", "layer", "all"]
HOW_LABELS = {"head": "One head", "layer": "Mean of a layer's heads", "all": "Mean of all layers and heads"}


def writing_attention(trace: Any, position: int, how: How = "head", layer: int = 0, head: int = 0) -> np.ndarray:
    """The attention of the query that wrote the token at ``position`` (the query at ``position - 1``) over every
    position before it, from an ``AttentionTrace`` or a ``CompactTrace``.

    Args:
        trace: the whole sequence's trace.
        position: the written token's position (1 or more; a reply's tokens are at ``reply_start`` and after).
        how: "head" (``layer``, ``head``), "layer" (the mean over ``layer``'s heads) or "all" (the mean over every
            layer's heads).

    Raises:
        ValueError: the position, layer, head or ``how`` is out of range.

    Shape: -> (position,) float64, summing to 1 (the query's row, its masked future left out).
    """
    n = trace.n_tokens
    if not 0 < position < n:
        raise ValueError(f"Position {position} was not written after another token: pick 1-{n - 1}.")
    if how not in HOW_LABELS:
        raise ValueError(f"how must be one of {', '.join(HOW_LABELS)}, not {how!r}.")
    if not 0 <= layer < trace.n_layers or not 0 <= head < trace.n_heads:
        raise ValueError(f"Layer {layer}, head {head} is out of range: layers 0-{trace.n_layers - 1}, heads "
                         f"0-{trace.n_heads - 1}.")
    query = position - 1
    layers = range(trace.n_layers) if how == "all" else [layer]
    heads = [head] if how == "head" else range(trace.n_heads)
    rows = [_row(trace, lay, h, query) for lay in layers for h in heads]
    return np.mean(rows, axis=0)


def _row(trace: Any, layer: int, head: int, query: int) -> np.ndarray:
    """One head's weights from ``query`` to keys 0..query. Shape: -> (query + 1,) float64."""
    if hasattr(trace, "lse"):  # a compact trace computes the row exactly from its queries, keys and lse
        return trace.weights(layer, head, slice(query, query + 1), slice(0, query + 1))[0].astype(np.float64)
    return trace.weights[layer, head, query, :query + 1].astype(np.float64)
