"""Words, not pieces: which pieces make a word, and attention between words (Clark et al., 2019).

Two rules, one per kind of tokenizer: WordPiece (BERT) marks a piece that *continues* a word with ``##``; byte-level
and SentencePiece BPE (GPT-2, Llama) mark a piece that *starts* a word with ``Ġ`` or ``▁``.

Attention *to* a word is the sum of the attention to its pieces; attention *from* a word is the mean of
its pieces' rows. A row of a merged matrix therefore still sums to what a row of the pieces summed to
(1 for softmax weights). [CLS], [SEP] and the other special tokens stay words of their own.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, replace

import numpy as np

# Markers that are never part of a word (the analyses read this set too, from model_core.analysis._common).
SPECIAL_TOKENS = frozenset({"[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]", "<s>", "</s>", "<pad>"})
# The sentence markers among them: what "Hide [CLS] and [SEP]" hides and the [CLS]/[SEP] shares count.
CLS_TOKENS = frozenset({"[CLS]", "<s>"})
SEP_TOKENS = frozenset({"[SEP]", "</s>"})
CONTINUATION = "##"
WORD_STARTS = ("Ġ", "▁", "Ċ", "ĉ")  # byte-level BPE's space / newline / tab, SentencePiece's space
_MARK_TEXT = str.maketrans({"Ġ": " ", "▁": " ", "Ċ": "\n", "ĉ": "\t"})
# Whitespace a token starts or ends with decides what it is (" Paris" starts a word, "Paris" continues one): the
# figures, tables and pickers draw it as visible marks; the CSVs keep the text as it is.
_VISIBLE = str.maketrans({" ": "␣", "\u00a0": "⍽", "\n": "↵", "\t": "⇥", "\r": "␍"})
RULE = ("Attention to a word is the sum over its pieces; attention from a word is the mean over its pieces, so "
        "each row still sums to 1 (Clark et al., 2019). [CLS] and [SEP] stay as they are.")


@dataclass(frozen=True)
class WordSpans:
    """The words of a WordPiece sequence.

    Attributes:
        words: each word, its pieces joined without the ``##`` marks.
        spans: (start, end) piece positions of each word, end excluded. Shape: (word, 2).
        n_pieces: the number of pieces (tokens) they cover.
    """

    words: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]
    n_pieces: int

    def __post_init__(self) -> None:
        if len(self.words) != len(self.spans):
            raise ValueError("words and spans must have the same length.")
        ends = [s for span in self.spans for s in span]
        if ends and (ends[0] != 0 or ends[-1] != self.n_pieces or any(a >= b for a, b in self.spans)
                     or any(self.spans[i][1] != self.spans[i + 1][0] for i in range(len(self.spans) - 1))):
            raise ValueError(f"spans {self.spans} must tile 0..{self.n_pieces} in order.")

    @classmethod
    def from_tokens(cls, tokens: tuple[str, ...] | list[str], rule: str = "wordpiece",
                    specials: frozenset[str] | set[str] = frozenset()) -> WordSpans:
        """Group pieces into words.

        Args:
            tokens: the pieces.
            rule: "wordpiece": a ``##`` piece continues the word before it; "bpe": a piece continues the word
                before it unless it starts with a word-start mark (``Ġ``, ``▁``, a newline), is punctuation only, or
                follows punctuation.
            specials: the tokenizer's special tokens, words of their own under either rule (besides
                ``SPECIAL_TOKENS``).
        """
        if rule not in ("wordpiece", "bpe"):
            raise ValueError(f"rule must be 'wordpiece' or 'bpe', got {rule!r}.")
        special = SPECIAL_TOKENS | frozenset(specials)
        words: list[str] = []
        spans: list[list[int]] = []
        for i, token in enumerate(tokens):
            if not spans or token in special or words[-1] in special:
                joins = False
            elif rule == "wordpiece":
                joins = token.startswith(CONTINUATION) and len(token) > len(CONTINUATION)
            else:
                joins = not (token.startswith(WORD_STARTS) or _punctuation(token) or _punctuation(tokens[i - 1])
                             or not tokens[i - 1].strip("".join(WORD_STARTS)))  # after a bare space or line break
            if joins:
                words[-1] += token[len(CONTINUATION):] if rule == "wordpiece" else token
                spans[-1][1] = i + 1
            else:
                words.append(token if rule == "wordpiece" else (token.lstrip("".join(WORD_STARTS)) or token))
                spans.append([i, i + 1])
        return cls(tuple(words), tuple((a, b) for a, b in spans), len(tokens))

    @property
    def n_words(self) -> int:
        return len(self.words)

    @property
    def any_split(self) -> bool:
        """Whether some word has more than one piece (else merging changes nothing but the labels)."""
        return self.n_words < self.n_pieces

    def array(self) -> np.ndarray:
        """The spans as an array. Shape: (word, 2) int64."""
        return np.asarray(self.spans, dtype=np.int64).reshape(-1, 2)

    def word_of(self, position: int) -> int:
        """The word that piece ``position`` belongs to."""
        if not 0 <= position < self.n_pieces:
            raise ValueError(f"position {position} is outside 0-{self.n_pieces - 1}.")
        starts = [a for a, _ in self.spans]
        return int(np.searchsorted(starts, position, side="right") - 1)

    def word_start(self, position: int | None) -> int | None:
        """The word index of a piece position such as ``sentence_b_start`` (None stays None)."""
        return None if position is None else self.word_of(position)

    def membership(self) -> np.ndarray:
        """1 where piece j belongs to word i. Shape: (word, pos)."""
        member = np.zeros((self.n_words, self.n_pieces), dtype=np.float64)
        for w, (a, b) in enumerate(self.spans):
            member[w, a:b] = 1.0
        return member

    def merge(self, matrix: np.ndarray) -> np.ndarray:
        """Merge a query x key matrix (or a stack of them) from pieces to words.

        Rows: the mean over a word's pieces; columns: the sum over its pieces.

        Shape: (..., q_pos, k_pos) -> (..., q_word, k_word), float32.
        """
        matrix = np.asarray(matrix)
        if matrix.shape[-2:] != (self.n_pieces, self.n_pieces):
            raise ValueError(f"matrix ends in {matrix.shape[-2:]}, expected ({self.n_pieces}, {self.n_pieces}).")
        member = self.membership()  # (word, pos)
        rows = member / member.sum(axis=1, keepdims=True)
        finite = np.where(np.isfinite(matrix), matrix, 0.0).astype(np.float64)
        return np.einsum("wq,...qk,vk->...wv", rows, finite, member, optimize=True).astype(np.float32)

    def merge_columns(self, values: np.ndarray) -> np.ndarray:
        """Sum over each word's pieces along the last axis (a value per key). Shape: (..., pos) -> (..., word)."""
        return (np.asarray(values, dtype=np.float64) @ self.membership().T).astype(np.float32)


def _punctuation(token: str) -> bool:
    text = token.lstrip("".join(WORD_STARTS))
    return bool(text) and all(unicodedata.category(c)[0] in "PS" for c in text)


def word_spans(tokens: tuple[str, ...] | list[str]) -> WordSpans:
    """``WordSpans.from_tokens``: the words of a WordPiece sequence (a trace's own rule: ``AttentionTrace.words``)."""
    return WordSpans.from_tokens(tokens)


def word_level_trace(trace, words: WordSpans, attentions: np.ndarray | None = None):
    """A trace whose tokens are ``words`` and whose attentions are merged by the rule above, for views that read
    only the attentions and the tokens (bertviz's head and model views).

    Its other per-token arrays are the means over each word's pieces (token ids and types: the first piece's; a
    decoder's next-token predictions: the last piece's),
    only so that the trace stays well-formed: they are not the model's own numbers, and views that read queries,
    keys or scores (the neuron view, the causal steps) must use the piece-level trace.

    Args:
        trace: the piece-level ``AttentionTrace``.
        words: ``word_spans(trace.tokens)``.
        attentions: ``words.merge(trace.weights)`` when it is already at hand (a cache).
    """
    member = words.membership()
    mean = member / member.sum(axis=1, keepdims=True)  # (word, pos)
    firsts = [a for a, _ in words.spans]

    def rows(x: np.ndarray, axis: int) -> np.ndarray:  # mean over pieces along ``axis``
        return np.moveaxis(np.tensordot(mean, np.moveaxis(np.asarray(x, dtype=np.float64), axis, 0), axes=1),
                           0, axis).astype(np.float32)

    merged = words.merge(trace.weights) if attentions is None else attentions
    mask = (member @ np.asarray(trace.mask, dtype=np.float64) @ member.T) > 0
    lasts = [b - 1 for _, b in words.spans]  # a decoder's next token after a word is the one after its last piece
    predictions = {} if trace.next_token_ids is None else dict(
        next_token_ids=np.asarray(trace.next_token_ids)[lasts], next_token_probs=np.asarray(trace.next_token_probs)[lasts],
        next_token_strings=tuple(trace.next_token_strings[i] for i in lasts))
    new = replace(
        trace, tokens=words.words, token_ids=np.asarray(trace.token_ids)[firsts],
        token_type_ids=np.asarray(trace.token_type_ids)[firsts],
        sentence_b_start=words.word_start(trace.sentence_b_start), weights=np.array(merged), mask=mask,
        queries=rows(trace.queries, 2), keys=rows(trace.keys, 2), values=rows(trace.values, 2),
        value_norms=rows(trace.value_norms, 2), hidden_states=rows(trace.hidden_states, 1),
        description=trace.description + " · words", **predictions)
    # The words lost their marks ("Ġ"): whether they are byte-level is the pieces' answer.
    new.__dict__["byte_level"] = trace.byte_level
    return new


def piece_text(token: str) -> str:
    """A piece as it reads in the text: byte-level BPE's and SentencePiece's space, newline and tab marks
    (``Ġ``, ``▁``, ``Ċ``, ``ĉ``) as those characters; WordPiece pieces are unchanged."""
    return token.translate(_MARK_TEXT)


def span_text(tokens: tuple[str, ...] | list[str], byte_level: bool | None = None) -> str:
    """A run of pieces as text: BPE pieces joined as the text reads (their marks carry the spaces; byte-level
    pieces decoded), WordPiece pieces spaced with each ``##`` continuation joined to the piece before it.

    ``byte_level``: the trace's own answer (``AttentionTrace.byte_level``); None judges the run alone, and never
    takes a run with a ``##`` piece (WordPiece, where "č" is a letter) for byte-level BPE."""
    if byte_level is None:
        byte_level = is_byte_level(tokens) and not any(t.startswith(CONTINUATION) for t in tokens)
    if byte_level:
        return _decoded("".join(tokens)).strip()
    if any(t.startswith(WORD_STARTS) for t in tokens):
        return "".join(piece_text(t) for t in tokens).strip()
    return " ".join(tokens).replace(f" {CONTINUATION}", "")


def shown_text(text: str) -> str:
    """A token's text with its spaces and line breaks visible ("␣Paris", "↵"); "∅" for an empty string."""
    return text.translate(_VISIBLE) if text else "∅"


def _byte_of_char() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2's ``bytes_to_unicode``), inverted: the printable bytes stand for
    themselves, every other byte for the character 256 + its rank among them."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    for rank, b in enumerate(b for b in range(256) if b not in chars):
        chars[b] = chr(256 + rank)
    return {c: b for b, c in chars.items()}


_BYTE_OF = _byte_of_char()
_REMAPPED = frozenset(c for c in _BYTE_OF if ord(c) >= 256)  # Ġ (space), Ċ (newline), ĉ (tab) and the like


def is_byte_level(tokens: tuple[str, ...] | list[str]) -> bool:
    """Whether pieces are byte-level BPE (GPT-2, Llama 3, SmolLM2, Qwen): every character is in its 256-character
    alphabet and at least one stands for a remapped byte (a space is ``Ġ``). Decided over the whole sequence, since
    one piece alone can be a real letter ("ł" in a SentencePiece vocabulary)."""
    text = "".join(tokens)
    return any(c in _REMAPPED for c in text) and all(c in _BYTE_OF for c in text)


def _decoded(token: str) -> str:
    """A byte-level piece as the text it stands for; a piece that ends inside a character shows its bytes."""
    if all(c in _BYTE_OF for c in token):
        return bytes(_BYTE_OF[c] for c in token).decode("utf-8", errors="backslashreplace")
    return token


def readable_tokens(tokens: tuple[str, ...] | list[str], rule: str, byte_level: bool | None = None) -> tuple[str, ...]:
    """Pieces as people read them, for labels: byte-level BPE decoded ("Ã©" -> "é", "Ġflies" -> "␣flies"),
    SentencePiece's ``▁`` as "␣", whitespace visible; WordPiece pieces unchanged.

    Args:
        tokens: the pieces (or words joined from them).
        rule: the family's word rule, "wordpiece" or "bpe".
        byte_level: whether the tokenizer is byte-level; decided from ``tokens`` when None (pass the trace's own
            answer when labelling words, whose marks are gone).
    """
    if rule != "bpe":
        return tuple(tokens)
    if byte_level is None:
        byte_level = is_byte_level(tokens)
    return tuple(shown_text(_decoded(t) if byte_level else t.replace("▁", " ")) for t in tokens)


_MARKDOWN = str.maketrans({c: "\\" + c for c in "\\`*_{}[]()#+-.!|$~<>"})


def markdown_text(text: str) -> str:
    """Token text to put inside Markdown (a page's caption): every character Markdown or its LaTeX would read
    ("*", "_", "$"...) escaped, so a token shows as itself."""
    return text.translate(_MARKDOWN)
