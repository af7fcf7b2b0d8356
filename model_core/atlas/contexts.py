"""Top contexts of every head from the texts' best pairs: the K highest, at most one a text, and samples from each
decile of the texts' best weights (HeadVis's "typical" contexts), each with the snippet around its query and key."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

TOP_K = 20
DECILE_SAMPLES = 5
SNIPPET_RADIUS = 4
"""Tokens kept on each side of the query and of the key."""
DECILES = 10


def top_texts(weights: np.ndarray, text_ids: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """The rows of the ``k`` highest weights, highest first; ties to the earlier text; NaN rows (no pair) left out.

    Shape: weights, text_ids (text,) -> (≤ k,) row indices.
    """
    ok = np.flatnonzero(np.isfinite(weights))
    order = np.lexsort((text_ids[ok], -weights[ok].astype(np.float64)))
    return ok[order[:k]]


def decile_samples(weights: np.ndarray, text_ids: np.ndarray, per_decile: int = DECILE_SAMPLES) -> list[np.ndarray]:
    """Rows sampled from each decile of the texts' best weights, lowest decile first: the texts are sorted by weight
    (ties to the earlier text), cut into ten groups of (nearly) equal size, and ``per_decile`` rows evenly spaced in
    each group are kept (all of a smaller group), each group's rows by weight, highest first.

    Shape: -> ten arrays of row indices (fewer rows where the corpus has fewer than 10 texts with a pair).
    """
    ok = np.flatnonzero(np.isfinite(weights))
    ascending = ok[np.lexsort((text_ids[ok], weights[ok].astype(np.float64)))]
    out = []
    for group in np.array_split(ascending, DECILES):
        if len(group) > per_decile:
            group = group[np.unique(np.linspace(0, len(group) - 1, per_decile).round().astype(int))]
        out.append(group[::-1])
    return out


class TokenText:
    """Each vocabulary id's text as the tokenizer decodes it alone, looked up once; a WordPiece token that starts a
    word gets the space its decoder would put before it (a byte-level BPE token carries its own)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._seen: dict[int, str] = {}
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        self._wordpiece = type(decoder).__name__ == "WordPiece" or "WordPiece" in repr(decoder)

    def __call__(self, token_id: int) -> str:
        text = self._seen.get(token_id)
        if text is None:
            if self._wordpiece:
                token = self.tokenizer.convert_ids_to_tokens(token_id)
                text = token[2:] if token.startswith("##") else " " + token
            else:
                text = self.tokenizer.decode([token_id], clean_up_tokenization_spaces=False)
            self._seen[token_id] = text
        return text


def snippet(ids: Sequence[int], query: int, key: int, text_of: TokenText,
            radius: int = SNIPPET_RADIUS) -> list[list[Any]]:
    """The tokens around the key and the query: [[position, token text], ...] in order (a jump in the positions is
    a gap)."""
    n = len(ids)
    keep = sorted({p for centre in (key, query) for p in range(max(0, centre - radius), min(n, centre + radius + 1))})
    return [[p, text_of(int(ids[p]))] for p in keep]


def context(row: int, text_ids: np.ndarray, weights: np.ndarray, queries: np.ndarray, keys: np.ndarray,
            token_ids: dict[int, list[int]], text_of: TokenText) -> dict[str, Any]:
    """One context as the atlas keeps it: {"text_id", "query", "key", "weight", "snippet"}."""
    text_id, q, k = int(text_ids[row]), int(queries[row]), int(keys[row])
    return {"text_id": text_id, "query": q, "key": k, "weight": float(weights[row]),
            "snippet": snippet(token_ids[text_id], q, k, text_of)}
