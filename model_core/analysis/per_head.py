"""Per-head statistics of attention, after Clark et al. (2019), "What Does BERT Look At? An Analysis
of BERT's Attention" (BlackboxNLP).

Every statistic is averaged over the query positions of one input, giving one number per
(layer, head): how spread out the head's attention is, and how much of it goes to [CLS], to [SEP],
to punctuation, to the token itself, to the previous and next token, and across the two sentences.

A decoder has no [CLS] or [SEP]: its ``to_cls`` is the share to the first token (the attention sink) and its
``to_sep`` the share to the tokenizer's special tokens after it (``_common.trace_flags``); the names stay, the
titles come from ``stat_titles``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from model_core.analysis._common import entropy_bits, markers, row_blocks, trace_flags
from model_core.trace.trace import AttentionTrace

STAT_NAMES: tuple[str, ...] = (
    "entropy", "to_cls", "to_sep", "to_punct", "to_self", "to_prev", "to_next", "a_to_b", "b_to_a"
)

# The statistics of one trace: Clark et al.'s, which corpus runs average too, and the largest single weight.
TRACE_STAT_NAMES: tuple[str, ...] = (*STAT_NAMES, "max_weight")

STAT_TITLES: dict[str, str] = {
    "entropy": "Entropy (bits)",
    "to_cls": "Share to [CLS]",
    "to_sep": "Share to [SEP]",
    "to_punct": "Share to punctuation",
    "to_self": "Share to self",
    "to_prev": "Share to previous token",
    "to_next": "Share to next token",
    "a_to_b": "Share from sentence A to B",
    "b_to_a": "Share from sentence B to A",
    "max_weight": "Largest weight",
}
"""Titles of an encoder's statistics; ``stat_titles`` gives any trace's."""


def stat_titles(trace: AttentionTrace) -> dict[str, str]:
    """``STAT_TITLES`` in the words of the trace's family: "Share to the first token" for a decoder's ``to_cls``."""
    names = markers(trace)
    return {**STAT_TITLES, "to_cls": f"Share to {names.first}", "to_sep": f"Share to {names.sep}"}


@dataclass(frozen=True, eq=False)
class HeadStats:
    """Clark et al.'s head statistics. Every field has Shape: (layer, head).

    Attributes:
        entropy: mean over queries of the entropy of the attention row, in bits.
        to_cls: mean over queries of the weight on [CLS] (a decoder's: on the first token).
        to_sep: mean over queries of the weight on all [SEP] tokens (a decoder's: on its special tokens after
            the first); NaN when the input has none.
        to_punct: mean over queries of the weight on punctuation tokens.
        to_self: mean over queries i of α_ii.
        to_prev: mean over queries i ≥ 1 of α_i,i-1.
        to_next: mean over queries i < n-1 of α_i,i+1.
        a_to_b: mean over the words of sentence A (specials and a decoder's first token excluded) of the
            weight on the words of sentence B; NaN for a single sentence.
        b_to_a: the same from B to A; NaN for a single sentence.
        max_weight: the largest single weight of the head, over every query that may see more than one key
            (a causal head's first query can only put 1 on itself), and every key (not an average over
            queries, so corpus runs do not keep it).
    """

    entropy: np.ndarray
    to_cls: np.ndarray
    to_sep: np.ndarray
    to_punct: np.ndarray
    to_self: np.ndarray
    to_prev: np.ndarray
    to_next: np.ndarray
    a_to_b: np.ndarray
    b_to_a: np.ndarray
    max_weight: np.ndarray

    def __post_init__(self) -> None:
        shape = self.entropy.shape
        if len(shape) != 2 or any(getattr(self, f.name).shape != shape for f in fields(self)):
            raise ValueError("Every statistic must be a (layer, head) array of the same shape.")

    @property
    def shape(self) -> tuple[int, int]:
        """(layer, head)."""
        return self.entropy.shape  # type: ignore[return-value]

    def to_dict(self) -> dict[str, np.ndarray]:
        """Statistic name -> (layer, head) array, in ``TRACE_STAT_NAMES`` order."""
        return {name: getattr(self, name) for name in TRACE_STAT_NAMES}

    def to_rows(self) -> list[dict[str, float | int]]:
        """One dict per head, ``layer`` and ``head`` first, for CSV export (NaN where undefined)."""
        n_layers, n_heads = self.shape
        return [
            {"layer": layer, "head": head, **{name: float(getattr(self, name)[layer, head]) for name in TRACE_STAT_NAMES}}
            for layer in range(n_layers)
            for head in range(n_heads)
        ]


_ROWS = 64
"""Query rows per block in ``head_stats``: a block of float64 weights stays in the cache (64 rows: 3x faster than
the whole layer at once for SmolLM2 at 512 tokens, 0.14 s instead of 0.41 s)."""


def head_stats(trace: AttentionTrace) -> HeadStats:
    """Compute Clark et al.'s statistics, and the largest weight, for every head of ``trace``.

    One block of query rows at a time in float64 (a float64 copy of a whole 512-token bert-base trace is 300 MB),
    each only over the keys its rows may see (``_common.row_blocks``): its entropy, and every share at once as one
    product with the token classes' indicator columns.
    """
    att = np.asarray(trace.weights)  # (layer, head, q_pos, k_pos)
    n_layers, n_heads, n, _ = att.shape
    flags = trace_flags(trace)
    columns = [flags["cls"], flags["sep"], flags["punct"]]
    pair = None
    if trace.sentence_b_start is not None:
        types = np.asarray(trace.token_type_ids)
        words = ~(flags["special"] | flags["cls"])  # a decoder's first token is its sink, not a word of A
        words_a = (types == 0) & words
        words_b = (types == 1) & words
        if words_a.any() and words_b.any():
            pair = words_a, words_b
            columns += [words_b, words_a]
    indicators = np.stack(columns, axis=1).astype(np.float64)  # (k_pos, class)
    shape = (n_layers, n_heads)
    entropy, to_cls, to_sep, to_punct = (np.empty(shape) for _ in range(4))
    a_to_b, b_to_a = np.full(shape, np.nan), np.full(shape, np.nan)
    allowed = np.asarray(trace.mask, dtype=bool)
    choosing = allowed.sum(axis=1) > 1  # queries with a choice: not a causal model's first
    if not choosing.any():
        choosing[:] = True
    max_weight = np.zeros(shape)
    blocks = list(row_blocks(allowed, _ROWS))
    for layer in range(n_layers):
        rows_entropy = np.empty((n_heads, n))
        shares = np.empty((n_heads, n, indicators.shape[1]))  # each query's weight on each class of keys
        for r0, r1, width in blocks:
            weights = att[layer, :, r0:r1, :width].astype(np.float64)  # (head, rows, keys they may see)
            rows_entropy[:, r0:r1] = entropy_bits(weights)
            shares[:, r0:r1] = weights @ indicators[:width]
            if choosing[r0:r1].any():
                np.maximum(max_weight[layer], weights[:, choosing[r0:r1]].max(axis=(-1, -2)), out=max_weight[layer])
        entropy[layer] = rows_entropy.mean(axis=-1)
        to_cls[layer], to_sep[layer], to_punct[layer] = (shares[..., c].mean(axis=-1) for c in range(3))
        if pair is not None:
            a_to_b[layer] = shares[:, pair[0], 3].mean(axis=-1)
            b_to_a[layer] = shares[:, pair[1], 4].mean(axis=-1)
    mean = lambda x: x.mean(axis=-1, dtype=np.float64)  # noqa: E731 - over the query positions
    nan = np.full(shape, np.nan)
    return HeadStats(
        entropy=entropy,
        to_cls=to_cls,
        to_sep=to_sep if flags["sep"].any() else np.full(shape, np.nan),  # no such token: undefined, not 0
        to_punct=to_punct,
        to_self=mean(np.diagonal(att, axis1=2, axis2=3)),
        to_prev=mean(np.diagonal(att, offset=-1, axis1=2, axis2=3)) if n > 1 else nan,
        to_next=mean(np.diagonal(att, offset=1, axis1=2, axis2=3)) if n > 1 else nan,
        a_to_b=a_to_b,
        b_to_a=b_to_a,
        max_weight=max_weight,
    )
