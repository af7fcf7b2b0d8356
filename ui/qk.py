"""The "Why this key" page's data and figures: the QK split of a focused head, computed once per (trace, head, query,
key, versus) for every session (``cached_qk``), and the figures that draw it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from attention_explorer.qk import (  # noqa: F401 (the page's)
    bars_figure,
    row_csv,
    row_figure,
    terms_csv,
    terms_figure,
)
from model_core import TraceRequest
from model_core.analysis._common import is_punctuation, is_special
from model_core.compact.trace import CompactTrace
from model_core.qk.gather import PartsPass
from model_core.qk.terms import QKTerms, qk_pass_for_trace, split_at
from model_core.trace.resolve import resolve
from ui.trace_cache import per_trace

INDUCTION_TEXT = ("The lighthouse keeper counted seven blue herons before the storm reached the harbour. "
                  "The lighthouse keeper counted seven blue herons before the storm reached the harbour.")
"""The team's ready example: a sentence said twice. In the repeat, an induction head attends from each token to the
token after its first occurrence; its score there follows a previous-token head's writes (K-composition)."""

@per_trace(spinner="Splitting this head's queries and keys into the parts of the residual stream…")
def cached_qk_pass(trace: Any, request: TraceRequest, layer: int, head: int) -> PartsPass:
    """The parts behind every split of one head on the trace's tokens (the positions the heatmaps show), once per
    (trace, head), from the full trace where there is one, else by the head's hooked pass: a change of query or key
    then costs no model run."""
    from ui.loaders import (  # ui.loaders imports the pages' caches; only needed on a miss
        CACHED_MODELS,
        device,
    )

    resolved = resolve(request, device=device(), models=CACHED_MODELS)
    return qk_pass_for_trace(resolved.model, trace, layer, head)


def cached_qk(trace: Any, request: TraceRequest, layer: int, head: int, query: int, key: int | None,
              versus: int | None, row: bool) -> QKTerms:
    """``model_core.qk.terms.split_at`` on the head's cached pass."""
    pass_ = cached_qk_pass(trace, request, layer, head)
    return split_at(pass_, [str(t) for t in trace.tokens], query, key, versus, row=row)


def induction_scores(weights: np.ndarray, period: int) -> np.ndarray:
    """Each head's induction score on a sequence repeated with ``period``: the mean attention from each token of the
    repeat to the token after its earlier occurrence. Shape: weights (layer, head, q, k) -> (layer, head)."""
    n = weights.shape[-1]
    rows = np.arange(period, n)
    if len(rows) == 0:
        return np.zeros(weights.shape[:2])
    return weights[:, :, rows, rows - period + 1].mean(axis=-1)


@dataclass(frozen=True)
class Opening:
    """Where the page opens when the user has not chosen a head: a head of the model's later half, a query and the
    key it attends to most among the words, and why (for the page's caption)."""

    layer: int
    head: int
    query: int
    key: int
    weight: float
    top: bool  # the key is the query's top key overall (the page's "the one it attends to most")
    reason: str


def _marker_like(tokens: tuple[str, ...], specials: frozenset[str], labels: tuple[str, ...]) -> np.ndarray:
    """Keys where attention parks rather than reads: the first token ([CLS], or a decoder's sink), special tokens,
    punctuation and whitespace. Shape: (pos,) bool."""
    sink = np.array([is_special(t, specials) or is_punctuation(t) or not label.strip("␣↵⇥␍⍽ ")
                     for t, label in zip(tokens, labels)], dtype=bool)
    sink[0] = True
    return sink


@per_trace()
def opening_head(trace: Any) -> Opening:
    """The head, query and key "Why this key" opens on when the user chose none: a query of a decoder is its last
    token (an encoder's: its last word); among the heads of the later half of the layers, whose queries and keys sum
    many earlier components, the one that gives that query's largest weight to a word (not the first token, a special
    token, punctuation or whitespace, nor the query itself), preferring heads whose top key is that word. Reads the
    trace's weights at one query row: no model run."""
    tokens = tuple(trace.tokens)
    n = len(tokens)
    labels = tuple(trace.labels)
    sink = _marker_like(tokens, frozenset(getattr(trace, "special_tokens", ())), labels)
    words = np.flatnonzero(~sink)
    query = n - 1 if trace.is_decoder or len(words) == 0 else int(words[-1])
    other = sink.copy()
    other[query] = True
    if trace.is_decoder:
        other[query + 1:] = True  # a decoder's query sees no later key
    first = trace.n_layers // 2
    layers = range(first, trace.n_layers)
    rows = np.stack([_row(trace, layer, query) for layer in layers])  # (layer, head, k_pos)
    if other.all():  # nothing but markers (or the query alone): the later half's first head, at its top key
        key = int(rows[0, 0].argmax())
        return Opening(first, 0, query, key, float(rows[0, 0, key]), True,
                       f"the first head of the model's later half; this text has no other word for {labels[query]!r} "
                       "to attend to")
    on_words = np.where(other, 0.0, rows)
    best = on_words.max(axis=-1)  # (layer, head)
    top = ~other[rows.argmax(axis=-1)]  # the head's top key is a word
    rank = np.where(top, best, best - 1.0)
    i, head = np.unravel_index(int(np.argmax(rank)), rank.shape)
    layer, key = first + int(i), int(on_words[i, head].argmax())
    weight = float(rows[i, head, key])
    span = f"layer {first}" if first == trace.n_layers - 1 else f"layers {first}–{trace.n_layers - 1}"
    which = "the last token" if query == n - 1 else "the last word"
    reason = (f"of the heads in the model's later half ({span}), where queries and keys sum many earlier components, "
              f"it gives the most attention from {which}, {labels[query]!r}, to another word: {weight:.0%} to "
              f"{labels[key]!r}")
    if not top[i, head]:
        reason += " (more goes to the first token or punctuation)"
    seen = query + 1 if trace.is_decoder else n  # the keys the query sees
    if weight < 3.0 / max(seen, 1):  # e.g. random weights: no head singles a key out
        reason += f"; every head here spreads its attention almost evenly (about 1/{seen} a key)"
    return Opening(layer, int(head), query, key, weight, bool(top[i, head]), reason)


def _row(trace: Any, layer: int, query: int) -> np.ndarray:
    """Every head's weights at one query row, from the full trace or computed exactly from a compact one.
    Shape: -> (head, k_pos)."""
    if isinstance(trace, CompactTrace):
        n = trace.n_tokens
        return np.asarray(trace.pair_weights(layer, np.full(n, query), np.arange(n)))
    return np.asarray(trace.weights[layer, :, query, :], dtype=np.float64)
