"""Small helpers the analyses share: special and punctuation tokens, the family's marker positions and their
names, entropy, JS divergence."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

# One set of special markers for words and analyses.
from model_core.words import CLS_TOKENS, SEP_TOKENS, SPECIAL_TOKENS, WORD_STARTS  # noqa: F401

if TYPE_CHECKING:
    from model_core.trace.trace import AttentionTrace

_EPS = 1e-12


def is_special(token: str, specials: frozenset[str] | set[str] = frozenset()) -> bool:
    """Whether ``token`` is a special marker such as [CLS], [SEP], [PAD], or one of the tokenizer's ``specials``
    (a decoder's <|endoftext|>, <|im_start|>...)."""
    return token in SPECIAL_TOKENS or token in specials


def is_punctuation(token: str) -> bool:
    """Whether ``token`` is made only of punctuation characters (Unicode category P*), after the piece marks
    (WordPiece's ``##``, byte-level BPE's ``Ġ``, SentencePiece's ``▁``) are taken off."""
    text = token[2:] if token.startswith("##") else token.lstrip("".join(WORD_STARTS))
    return bool(text) and not is_special(token) and all(unicodedata.category(c).startswith("P") for c in text)


def token_flags(tokens: tuple[str, ...] | list[str]) -> dict[str, np.ndarray]:
    """Boolean position masks of an encoder's tokens: "cls", "sep", "special", "punct".

    Shape: each (pos,) bool.
    """
    return {
        "cls": np.array([t in CLS_TOKENS for t in tokens], dtype=bool),
        "sep": np.array([t in SEP_TOKENS for t in tokens], dtype=bool),
        "special": np.array([is_special(t) for t in tokens], dtype=bool),
        "punct": np.array([is_punctuation(t) for t in tokens], dtype=bool),
    }


def trace_flags(trace: AttentionTrace) -> dict[str, np.ndarray]:
    """``token_flags`` as the trace's family reads its tokens.

    An encoder's "cls" and "sep" are its [CLS] and [SEP] tokens. A decoder has neither: its "cls" column is
    position 0, the first token, whatever it is (a BOS token or the first word; decoders park much of their
    attention there, an "attention sink"), and its "sep" columns are the tokenizer's special tokens after
    position 0 (an end-of-text or end-of-turn token; plain text usually has none).

    Shape: each (pos,) bool.
    """
    if not trace.is_decoder:
        return token_flags(trace.tokens)
    special = np.array([is_special(t, trace.special_tokens) for t in trace.tokens], dtype=bool)
    first = np.zeros(trace.n_tokens, dtype=bool)
    first[0] = True
    return {
        "cls": first,
        "sep": special & ~first,
        "special": special,
        "punct": np.array([is_punctuation(t) for t in trace.tokens], dtype=bool) & ~special,
    }


@dataclass(frozen=True)
class Markers:
    """What the analyses call the family's marker tokens, for titles and legends.

    Attributes:
        first: the "cls" column's name: "[CLS]", or "the first token" for a decoder (``Family.first_label``).
        sep: the "sep" columns' name: "[SEP]", or "other special tokens" for a decoder.
        first_short: ``first`` for a legend or a bin ("[CLS]", "first token").
        both: the two together, e.g. "[CLS]+[SEP]" or "first token + other special tokens".
        readout: the position whose output the model's head reads: [CLS] (0) for an encoder, the last token
            (the one that predicts the next) for a decoder.
        readout_label: its name, e.g. "[CLS]" or "the last token".
    """

    first: str
    sep: str
    first_short: str
    both: str
    readout: int
    readout_label: str


def markers(trace: AttentionTrace) -> Markers:
    """The family's marker names and its read-out position for this trace (see ``trace_flags``)."""
    family = trace.family
    if trace.is_decoder:
        short = family.first_label.removeprefix("the ")
        return Markers(first=family.first_label, sep="other special tokens", first_short=short,
                       both=f"{short} + other special tokens", readout=trace.n_tokens - 1,
                       readout_label="the last token")
    return Markers(first=family.first_label, sep="[SEP]", first_short=family.first_label,
                   both=f"{family.first_label}+[SEP]", readout=0, readout_label=family.first_label)


def entropy_bits(p: np.ndarray, axis: int = -1) -> np.ndarray:
    """Shannon entropy in bits along ``axis``, in float64; 0·log 0 counts as 0."""
    p = np.asarray(p, dtype=np.float64)
    logp = np.log2(p, out=np.zeros_like(p), where=p > 0)  # no log of the zeros at all: ~1.5x faster
    return -(p * logp).sum(axis=axis)


def js_divergence(p: np.ndarray, q: np.ndarray, axis: int = -1) -> np.ndarray:
    """Jensen-Shannon divergence in bits (0 = same distribution, 1 = disjoint supports).

    Both inputs are renormalised along ``axis`` first; a row that sums to 0 gives NaN.
    """
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    p_sum = p.sum(axis=axis, keepdims=True)
    q_sum = q.sum(axis=axis, keepdims=True)
    empty = (p_sum <= _EPS) | (q_sum <= _EPS)
    p = p / np.where(empty, 1.0, p_sum)
    q = q / np.where(empty, 1.0, q_sum)
    m = 0.5 * (p + q)
    js = 0.5 * _kl(p, m, axis) + 0.5 * _kl(q, m, axis)
    js = np.clip(js, 0.0, 1.0)
    return np.where(np.squeeze(empty, axis=axis), np.nan, js)


def _kl(p: np.ndarray, m: np.ndarray, axis: int) -> np.ndarray:
    ratio = np.where(p > 0, p / np.where(m > 0, m, 1.0), 1.0)
    return (p * np.log2(ratio)).sum(axis=axis)


def row_blocks(allowed: np.ndarray, size: int):
    """(first row, end row, keys) for blocks of ``size`` query rows: the keys are the columns up to the last one any
    row of the block may see, so a causal block skips the zeros right of its last row (about 40% of a causal trace's
    weights at 512 tokens). Weights outside the mask are exactly 0, so sums over the keys are the same.

    Shape: allowed (q_pos, k_pos) bool."""
    n = allowed.shape[0]
    for r0 in range(0, n, size):
        r1 = min(r0 + size, n)
        seen = np.flatnonzero(allowed[r0:r1].any(axis=0))
        yield r0, r1, int(seen[-1]) + 1 if seen.size else allowed.shape[1]
