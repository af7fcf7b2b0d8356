"""Synthetic AttentionTraces from seeded random arrays, for tests and benchmarks (no model needed)."""

from __future__ import annotations

import numpy as np

from model_core.trace.trace import AttentionTrace

DEFAULT_A = ("time", "flies", "like", "an", "arrow")
DEFAULT_B = ("fruit", "flies", "like", "a", "banana")
_FILLER = ("the", "bank", "vault", "river", "##s", "old", ",", "of", "and", "cash", "##ing", ".", "water")


def synthetic_tokens(n_tokens: int, pair: bool = True) -> tuple[tuple[str, ...], int | None]:
    """Tokens of a plausible pair: [CLS] a… [SEP] b… [SEP], padded with filler words.

    Returns:
        The tokens and the index of sentence B's first token (None for one sentence).
    """
    if n_tokens < (5 if pair else 3):
        raise ValueError(f"A synthetic {'pair' if pair else 'sentence'} needs more tokens than {n_tokens}.")
    n_words = n_tokens - (3 if pair else 2)
    base = list(DEFAULT_A + DEFAULT_B) if pair else list(DEFAULT_A)
    words = (base + [_FILLER[i % len(_FILLER)] for i in range(max(0, n_words - len(base)))])[:n_words]
    if not pair:
        return ("[CLS]", *words, "[SEP]"), None
    half = (n_words + 1) // 2
    if n_words >= len(base):
        half = max(len(DEFAULT_A), (n_words + 1) // 2) if n_words > len(base) else len(DEFAULT_A)
        words = list(DEFAULT_A) + words[len(base) :][: half - len(DEFAULT_A)] + list(DEFAULT_B)
        words += [_FILLER[(i + 3) % len(_FILLER)] for i in range(n_words - len(words))]
    tokens = ("[CLS]", *words[:half], "[SEP]", *words[half:], "[SEP]")
    return tokens, half + 2


def synthetic_trace(
    n_tokens: int = 13,
    n_layers: int = 12,
    n_heads: int = 12,
    d_head: int = 8,
    *,
    seed: int = 0,
    pair: bool = True,
    causal: bool = False,
    sharpness: float = 3.0,
    tokens: tuple[str, ...] | None = None,
    sentence_b_start: int | None = None,
    logits: bool = True,
    head_mask: np.ndarray | None = None,
) -> AttentionTrace:
    """A trace with seeded random softmax attention, values, hidden states and logits.

    ``sharpness`` scales the random scores: larger values give peakier attention.
    """
    rng = np.random.default_rng(seed)
    if tokens is None:
        tokens, sentence_b_start = synthetic_tokens(n_tokens, pair)
    n = len(tokens)
    types = np.zeros(n, dtype=np.int64)
    if sentence_b_start is not None:
        types[sentence_b_start:] = 1
    mask = np.tril(np.ones((n, n), dtype=bool)) if causal else np.ones((n, n), dtype=bool)
    queries = rng.standard_normal((n_layers, n_heads, n, d_head)).astype(np.float32)
    keys = rng.standard_normal((n_layers, n_heads, n, d_head)).astype(np.float32)
    values = rng.standard_normal((n_layers, n_heads, n, d_head)).astype(np.float32)
    scores = sharpness * np.matmul(queries, np.swapaxes(keys, -1, -2)) / np.sqrt(d_head)
    scores = np.where(mask, scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = (weights / weights.sum(axis=-1, keepdims=True)).astype(np.float32)
    return AttentionTrace(
        tokens=tuple(tokens),
        token_ids=np.arange(n, dtype=np.int64),
        token_type_ids=types,
        sentence_b_start=sentence_b_start,
        weights=weights,
        mask=mask,
        queries=queries,
        keys=keys,
        values=values,
        value_norms=np.abs(rng.standard_normal((n_layers, n_heads, n))).astype(np.float32) + 0.1,
        hidden_states=rng.standard_normal((n_layers + 1, n, 4 * d_head)).astype(np.float32),
        model_kind="custom",
        causal=causal,
        description="synthetic random trace",
        logits=rng.standard_normal(2).astype(np.float32) if logits else None,
        head_mask=head_mask,
    )
