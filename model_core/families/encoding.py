"""Text to tokens: clean the text, run the model's tokenizer (an encoder's WordPiece with [CLS]/[SEP], or a
decoder's BPE), and refuse what cannot be traced."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any

import torch

from model_core.settings import CHARS_PER_TOKEN_BOUND, HARD_MAX_TOKENS, text_char_cap

DEFAULT_TEXT_A = "time flies like an arrow"
DEFAULT_TEXT_B = "fruit flies like a banana"
MAX_TEXT_CHARS = text_char_cap(HARD_MAX_TOKENS)
"""The most characters any setting lets a text have (131,072: the cap of the largest token limit). A text's own cap
is ``text_char_cap`` of the token limit it is encoded for (``encode``'s ``max_tokens``)."""


class InputError(ValueError):
    """The text cannot be traced; the message says what to change."""


@dataclass(frozen=True)
class EncodedInput:
    """A tokenised sentence (pair) for a batch of one.

    Shape: input_ids, token_type_ids: (1, pos).
    """

    tokens: tuple[str, ...]
    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    sentence_b_start: int | None
    truncated: bool = False


def clean_text(text: str | None) -> str:
    """Drop control, zero-width and lone surrogate characters; they carry nothing a tokenizer keeps."""
    text = text or ""
    # Cs: a lone surrogate (e.g. from a malformed URL) makes the Rust tokenizer raise TypeError.
    return "".join(c for c in text if not (unicodedata.category(c) in ("Cc", "Cf", "Cs") and c not in "\t\n")).strip()


PAIR_JOIN = "\n"
"""A decoder reads a pair as one text: A, a line break, then B."""


def encode(
    tokenizer: Any,
    text: str,
    text_b: str | None = None,
    *,
    max_tokens: int = HARD_MAX_TOKENS,
    truncate: bool = False,
    limit_hint: str = "",
    decoder: bool = False,
) -> EncodedInput:
    """Tokenise with BERT's WordPiece: [CLS] A [SEP] (B [SEP]), token types 0 then 1; with ``decoder``, as a decoder
    language model reads text (``encode_decoder``).

    Before tokenising, a text (A and B together) over ``text_char_cap(max_tokens)`` characters is refused, with or
    without ``truncate``: no text that fits ``max_tokens`` tokens at up to 16 characters a token is.

    Raises:
        InputError: empty text, text that gives no tokens, more characters than the cap, or more than
            ``max_tokens`` tokens without ``truncate``.
    """
    a, b = _check_length(text, text_b, max_tokens, limit_hint)
    pieces = _decoder_pieces if decoder else _wordpiece_pieces
    ids, types, b_start = pieces(tokenizer, a, b, None)
    n = len(ids)
    if n > max_tokens:
        if not truncate:
            raise InputError(f"The input has {n} tokens; the limit is {max_tokens}{limit_hint}. Shorten it, "
                             "or ask for truncation to keep the first tokens.")
        ids, types, b_start = pieces(tokenizer, a, b, max_tokens)
    return EncodedInput(
        tokens=tuple(tokenizer.convert_ids_to_tokens(ids)),
        input_ids=torch.tensor([ids], dtype=torch.long),
        token_type_ids=torch.tensor([types], dtype=torch.long),
        sentence_b_start=b_start,
        truncated=len(ids) < n,
    )


def encode_decoder(tokenizer: Any, text: str, text_b: str | None = None, **limit: Any) -> EncodedInput:
    """Tokenise for a decoder language model: the tokenizer's own special tokens (a BOS where it adds one), no
    [CLS]/[SEP]. A pair is one text, A + a line break + B, tokenised together as the model would read it;
    ``sentence_b_start`` is B's first token and the token types are 0 before it and 1 from it. ``limit``: ``encode``'s
    ``max_tokens``, ``truncate`` and ``limit_hint``.

    Raises:
        InputError: empty text, or more than ``max_tokens`` tokens without ``truncate``.
    """
    return encode(tokenizer, text, text_b, decoder=True, **limit)


Pieces = tuple[list[int], list[int], "int | None"]
"""A tokenised input: ids, token types, and where sentence B starts (or None)."""


def _wordpiece_pieces(tokenizer: Any, a: str, b: str, max_tokens: int | None) -> Pieces:
    """[CLS] A [SEP] (B [SEP]); kept within ``max_tokens`` by the tokenizer's truncation (which keeps the [SEP]s)."""
    if max_tokens is not None:
        full = tokenizer(a, b or None, add_special_tokens=True, truncation=True, max_length=max_tokens)
    else:
        full = tokenizer(a, b or None, add_special_tokens=True, truncation=False)
        n = len(full["input_ids"])
        # Words per sentence, without [CLS]/[SEP]: e.g. only combining accents, which uncased BERT
        # strips, leave none, and there is nothing to attend to.
        all_types = full.get("token_type_ids") or [0] * n
        n_words_b = all_types.count(1) - 1 if b else 0
        for name, words in (("Sentence A", n - (3 if b else 2) - n_words_b), ("Sentence B", n_words_b if b else 1)):
            if words <= 0:
                raise InputError(f"{name} gives no tokens the model knows (only accents, marks or spaces); "
                                 "type some words.")
    ids = list(full["input_ids"])
    types = list(full.get("token_type_ids") or [0] * len(ids))
    return ids, types, types.index(1) if b and 1 in types else None


def _decoder_pieces(tokenizer: Any, a: str, b: str, max_tokens: int | None) -> Pieces:
    """A + a line break + B tokenised as one text, the first ``max_tokens`` kept."""
    joined = a + PAIR_JOIN + b if b else a
    full = tokenizer(joined, add_special_tokens=True, truncation=False, return_offsets_mapping=bool(b))
    ids = list(full["input_ids"])[:max_tokens]
    b_start = None
    if b:
        start_of_b = len(a) + len(PAIR_JOIN)
        b_start = next((i for i, (s, e) in enumerate(full["offset_mapping"]) if e > s and s >= start_of_b), None)
        if b_start is not None and b_start >= len(ids):
            b_start = None  # truncation cut B off
    types = [0] * len(ids) if b_start is None else [0] * b_start + [1] * (len(ids) - b_start)
    return ids, types, b_start


def _check_length(text: str | None, text_b: str | None, max_tokens: int, limit_hint: str) -> tuple[str, str]:
    """The texts cleaned, after refusing more characters than the cap of ``max_tokens`` (checked first, on the raw
    lengths: a 5 MB paste is refused before any pass over it)."""
    n_chars = len(text or "") + len(text_b or "")
    tokens = min(max_tokens, HARD_MAX_TOKENS)  # a corpus encodes with no token limit; its texts are cut first
    cap = text_char_cap(tokens)
    if n_chars > cap:
        raise InputError(f"The text has {n_chars} characters, more than {cap:,}: {CHARS_PER_TOKEN_BOUND} characters a "
                         f"token for the limit of {tokens:,} tokens{limit_hint}. Paste a shorter passage.")
    a, b = clean_text(text), clean_text(text_b)
    if not a:
        if b:
            raise InputError("Sentence A is empty; type sentence A (sentence B is optional).")
        raise InputError("The text is empty; type a sentence.")
    return a, b


