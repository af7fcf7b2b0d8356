"""One word, two contexts: how a word's attention and hidden states differ between two occurrences.

The idea of comparing one word's representations across contexts follows Ethayarajh (2019),
"How Contextual are Contextualized Word Representations?" (EMNLP), which measures the cosine
similarity of a word's hidden states across contexts layer by layer; the attention comparison uses
the Jensen-Shannon divergence (Lin 1991) over a common support described in ``compare_contexts``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from model_core.analysis._common import (
    WORD_STARTS,
    is_punctuation,
    is_special,
    js_divergence,
    markers,
    trace_flags,
)
from model_core.trace.trace import AttentionTrace

Support = Literal["categories", "offsets"]

CATEGORY_BINS: tuple[str, ...] = ("[CLS]", "[SEP]", "self", "previous", "next", "own sentence", "other sentence")
"""The bins of the "categories" support of an encoder, in order (``support_bins`` names a decoder's)."""


@dataclass(frozen=True)
class WordSpan:
    """One occurrence of a word: WordPiece sub-tokens joined back together.

    Attributes:
        word: the word as the tokenizer spells it, sub-tokens joined ("##" removed).
        start: first token position.
        end: one past the last token position (half-open span).
        sentence: "a" or "b" (by ``token_type_ids``).
    """

    word: str
    start: int
    end: int
    sentence: str

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise ValueError(f"A word span needs 0 <= start < end; got [{self.start}, {self.end}).")
        if self.sentence not in ("a", "b"):
            raise ValueError(f"sentence must be 'a' or 'b', not {self.sentence!r}.")

    @property
    def n_subtokens(self) -> int:
        """How many WordPiece tokens the word was split into."""
        return self.end - self.start

    def label(self) -> str:
        """Short label such as ``flies (a, tokens 2-2)``."""
        return f"{self.word} ({self.sentence}, tokens {self.start}-{self.end - 1})"


def text_words(trace: AttentionTrace) -> tuple[WordSpan, ...]:
    """Every word of the trace, sub-tokens joined by the family's rule (``AttentionTrace.words``: WordPiece's
    "##" continues a word, BPE's "Ġ"/"▁" starts one), special tokens and bare line breaks left out.

    Punctuation tokens are words of their own.
    """
    words = trace.words()
    return tuple(WordSpan(word.removeprefix("##").lower(), start, end,
                          "b" if int(trace.token_type_ids[start]) == 1 else "a")
                 for word, (start, end) in zip(words.words, words.spans)
                 if not is_special(word, trace.special_tokens) and word.strip("".join(WORD_STARTS)).strip())


def find_occurrences(trace: AttentionTrace, word: str) -> tuple[WordSpan, ...]:
    """All occurrences of ``word`` in the trace (case-insensitive, sub-tokens joined).

    Raises:
        ValueError: ``word`` is empty.
    """
    target = word.strip().lower()
    if not target:
        raise ValueError("Give a word to look for, e.g. 'flies'.")
    return tuple(span for span in text_words(trace) if span.word == target)


def repeated_words(trace: AttentionTrace) -> tuple[str, ...]:
    """Words (not punctuation) that occur at least twice, in order of first appearance."""
    counts: dict[str, int] = {}
    for span in text_words(trace):
        if not is_punctuation(span.word):
            counts[span.word] = counts.get(span.word, 0) + 1
    return tuple(w for w, c in counts.items() if c >= 2)


def word_attention(trace: AttentionTrace, span: WordSpan) -> np.ndarray:
    """The word's attention distribution: the mean of its sub-tokens' query rows.

    The mean of distributions is a distribution, so each row still sums to 1.

    Shape: (layer, head, k_pos).
    """
    _check_span(trace, span)
    return trace.weights[:, :, span.start : span.end, :].astype(np.float64).mean(axis=2)


def word_hidden_states(trace: AttentionTrace, span: WordSpan) -> np.ndarray:
    """The word's hidden state at every layer, sub-tokens mean-pooled.

    Shape: (layer + 1, hidden).
    """
    _check_span(trace, span)
    return trace.hidden_states[:, span.start : span.end, :].astype(np.float64).mean(axis=1)


def support_bins(support: Support, window: int = 3, trace: AttentionTrace | None = None) -> tuple[str, ...]:
    """Names of the bins of a support, in order.

    The first two bins are the family's markers (``_common.markers``): [CLS] and [SEP] for an encoder (and
    when no trace is given), "first token" and "other special tokens" for a decoder.
    """
    first, sep = ("[CLS]", "[SEP]") if trace is None else _marker_bins(trace)
    if support == "categories":
        return (first, sep, *CATEGORY_BINS[2:])
    if support == "offsets":
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}.")
        left = tuple(str(-d) for d in range(window, 0, -1))
        right = tuple(f"+{d}" for d in range(1, window + 1))
        return (first, sep, f"< -{window}", *left, "self", *right, f"> +{window}")
    raise ValueError(f"support must be 'categories' or 'offsets', not {support!r}.")


def _marker_bins(trace: AttentionTrace) -> tuple[str, str]:
    names = markers(trace)
    return names.first_short, names.sep


def bin_assignment(trace: AttentionTrace, span: WordSpan, support: Support, window: int = 3) -> np.ndarray:
    """Which bin of the common support each key position falls in, seen from ``span``.

    "categories": [CLS]; [SEP]; self (the word's own sub-tokens); previous and next (the token just
    before / after the word, unless it is special); own sentence and other sentence (the remaining
    non-special tokens, by ``token_type_ids``).

    "offsets": [CLS]; [SEP]; then the distance of the key from the word: -1 is the token just before
    its first sub-token, +1 the token just after its last, counted across the sentence boundary;
    distances beyond ``window`` are pooled into "< -window" and "> +window". Special tokens always
    go to [CLS]/[SEP], whatever their distance.

    A decoder's first two bins are the first token (position 0, the attention sink, even when it is part
    of the word) and its other special tokens (``_common.trace_flags``).

    Shape: (k_pos,) int, indices into ``support_bins(support, window)``.
    """
    _check_span(trace, span)
    bins = support_bins(support, window, trace)
    index = {name: i for i, name in enumerate(bins)}
    first, sep = bins[0], bins[1]
    flags = trace_flags(trace)
    types = np.asarray(trace.token_type_ids)
    own_type = int(types[span.start])
    out = np.empty(trace.n_tokens, dtype=np.int64)
    for k in range(trace.n_tokens):
        if flags["cls"][k]:
            out[k] = index[first]
        elif flags["sep"][k] or flags["special"][k]:
            out[k] = index[sep]
        elif span.start <= k < span.end:
            out[k] = index["self"]
        elif support == "categories":
            if k == span.start - 1:
                out[k] = index["previous"]
            elif k == span.end:
                out[k] = index["next"]
            else:
                out[k] = index["own sentence" if int(types[k]) == own_type else "other sentence"]
        else:
            offset = k - span.start if k < span.start else k - span.end + 1
            if offset < -window:
                out[k] = index[f"< -{window}"]
            elif offset > window:
                out[k] = index[f"> +{window}"]
            else:
                out[k] = index[str(offset) if offset < 0 else f"+{offset}"]
    return out


def binned_word_attention(
    trace: AttentionTrace, span: WordSpan, support: Support = "categories", window: int = 3
) -> np.ndarray:
    """The word's attention distribution summed into the bins of the common support.

    Shape: (layer, head, bin).
    """
    attention = word_attention(trace, span)
    assignment = bin_assignment(trace, span, support, window)
    one_hot = np.zeros((trace.n_tokens, len(support_bins(support, window, trace))))
    one_hot[np.arange(trace.n_tokens), assignment] = 1.0
    return attention @ one_hot  # (layer, head, k_pos) @ (k_pos, bin)


@dataclass(frozen=True, eq=False)
class ContextComparison:
    """One word in two contexts, compared head by head and layer by layer.

    Attributes:
        first: the first occurrence.
        second: the second occurrence (possibly in another trace).
        support: "categories" or "offsets".
        bins: names of the support's bins.
        dist_first: the first occurrence's binned attention. Shape: (layer, head, bin).
        dist_second: the second occurrence's binned attention. Shape: (layer, head, bin).
        js: Jensen-Shannon divergence in bits, 0 (same) to 1 (disjoint). Shape: (layer, head).
        hidden_cosine: cosine similarity of the pooled hidden states, embeddings first.
            Shape: (layer + 1,).
    """

    first: WordSpan
    second: WordSpan
    support: str
    bins: tuple[str, ...]
    dist_first: np.ndarray
    dist_second: np.ndarray
    js: np.ndarray
    hidden_cosine: np.ndarray

    def __post_init__(self) -> None:
        if self.dist_first.shape != self.dist_second.shape or self.dist_first.shape[-1] != len(self.bins):
            raise ValueError("dist_first and dist_second must both be (layer, head, bin) over the same bins.")
        if self.js.shape != self.dist_first.shape[:2]:
            raise ValueError("js must be (layer, head).")
        if self.hidden_cosine.shape != (self.js.shape[0] + 1,):
            raise ValueError("hidden_cosine must be (layer + 1,).")

    @property
    def separation_layer(self) -> int | None:
        """First hidden-state layer (0 = embeddings) where the cosine drops below 0.9, or None."""
        below = np.flatnonzero(self.hidden_cosine < 0.9)
        return int(below[0]) if below.size else None


def compare_contexts(
    trace: AttentionTrace,
    first: WordSpan,
    second: WordSpan,
    *,
    support: Support = "categories",
    window: int = 3,
    second_trace: AttentionTrace | None = None,
) -> ContextComparison:
    """Compare one word's attention and hidden states between two occurrences.

    The two occurrences attend over different positions, so the key positions are first mapped to a
    common support (see ``bin_assignment``): by default categories ([CLS], [SEP], self, previous,
    next, own sentence, other sentence), which have the same meaning from any position. The JS
    divergence is then taken per (layer, head) between the two binned distributions. A word split
    into several sub-tokens is pooled: the mean of its query rows, the mean of its hidden states.

    Args:
        trace: the trace holding ``first`` (and ``second``, unless ``second_trace`` is given).
        first: an occurrence, e.g. from ``find_occurrences``.
        second: the other occurrence.
        support: "categories" or "offsets".
        window: for "offsets", how many positions either side get a bin of their own.
        second_trace: a different trace holding ``second`` (e.g. the word run in another sentence).

    Raises:
        ValueError: a span lies outside its trace, or the two traces come from different models.
    """
    other = trace if second_trace is None else second_trace
    if other.weights.shape[:2] != trace.weights.shape[:2] or other.hidden_size != trace.hidden_size:
        raise ValueError("Both traces must come from the same model (same layers, heads and hidden size).")
    dist_first = binned_word_attention(trace, first, support, window)
    dist_second = binned_word_attention(other, second, support, window)
    h1 = word_hidden_states(trace, first)
    h2 = word_hidden_states(other, second)
    cosine = (h1 * h2).sum(-1) / np.maximum(np.linalg.norm(h1, axis=-1) * np.linalg.norm(h2, axis=-1), 1e-12)
    return ContextComparison(
        first=first,
        second=second,
        support=support,
        bins=support_bins(support, window, trace),
        dist_first=dist_first,
        dist_second=dist_second,
        js=js_divergence(dist_first, dist_second),
        hidden_cosine=cosine,
    )


def compare_word(
    trace: AttentionTrace, word: str, *, support: Support = "categories", window: int = 3
) -> ContextComparison:
    """Compare the first two occurrences of ``word`` in one trace.

    Raises:
        ValueError: the word occurs fewer than twice; the message lists words that do repeat.
    """
    spans = find_occurrences(trace, word)
    if len(spans) < 2:
        candidates = ", ".join(repeated_words(trace)) or "none in this text"
        raise ValueError(
            f"'{word}' occurs {len(spans)} time(s); it must occur twice. Words that occur twice: {candidates}."
        )
    return compare_contexts(trace, spans[0], spans[1], support=support, window=window)


def _check_span(trace: AttentionTrace, span: WordSpan) -> None:
    if span.end > trace.n_tokens:
        raise ValueError(f"The span {span.label()} lies outside this trace of {trace.n_tokens} tokens.")
