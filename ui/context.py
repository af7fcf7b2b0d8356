"""The per-run context every page reads: the sidebar's request, its one trace, and the focused head.

The context names its trace by its key in the one trace cache and never holds the trace itself: it is stored in the
session's state, which outlives the run (``ui.run_traces`` says why and holds the trace for the run).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import streamlit as st

import numpy as np

from model_core import AttentionTrace, TraceRequest
from model_core.analysis import Markers, markers
from model_core.compact.trace import CompactTrace
from model_core.settings import Settings
from model_core.words import WordSpans, readable_tokens
from ui.focus import Focus
from ui.run_traces import TraceKey, TraceKind, begin_run, hold, resolve, track_page
from ui.st_private import leave_legacy_pages_mode

_KEY = "_app_context"


@dataclass(frozen=True, eq=False)
class AppContext:
    """What app.py computed this run, before the page runs."""

    # What the sidebar asks for; None when its options do not fit together (``error`` says why).
    request: TraceRequest | None
    settings: Settings
    error: str | None
    # Which trace this run has for ``request`` ("full", or a long input's "compact"), or None (``error`` says why):
    # ``trace`` and ``compact`` read it from the cache (``resolve``).
    kind: TraceKind | None = None
    # The trace's shape, for a widget callback (it runs before the next run holds the trace).
    n_layers: int = 0
    n_heads: int = 0
    # The focused head at the start of this run, held to the trace's shape (``ui.focus.clamp_focus``). A page that
    # draws the picker in a fragment reads the focus its ``draw`` is given instead, which a fragment rerun updates.
    focus: Focus = Focus()
    # The sidebar container of the layer/head picker: app.py fills it, or the page when its entry in app.PAGES says
    # it draws the picker (``ui.state.head_fragment``).
    head_slot: "object | None" = None
    # The trace's words when the sidebar's "Words, not WordPieces" is on, else None.
    words: WordSpans | None = None

    @property
    def key(self) -> TraceKey | None:
        """The trace's key in ``ui.loaders.TRACES``, or None when there is no trace."""
        return None if self.kind is None or self.request is None else (self.kind, self.request)

    @property
    def trace(self) -> AttentionTrace | None:
        """This run's full trace (the cache's: ``resolve``), or None (a long input's compact trace, or an error)."""
        return resolve(self.key) if self.kind == "full" else None  # type: ignore[arg-type,return-value]

    @property
    def compact(self) -> CompactTrace | None:
        """A long input's compact trace (``model_core.compact.trace``), or None; ``trace`` is None then."""
        return resolve(self.key) if self.kind == "compact" else None  # type: ignore[arg-type,return-value]

    @property
    def layer(self) -> int:
        """The focused layer (``focus.layer``)."""
        return self.focus.layer

    @property
    def head(self) -> int:
        """The focused head (``focus.head``)."""
        return self.focus.head

    def labels(self, raw: bool = False) -> tuple[tuple[str, ...], int | None]:
        """The labels of the views' rows and columns (tokens, or words when the toggle is on, as people read
        them: ``AttentionTrace.labels``) and where sentence B starts among them. ``raw``: the tokenizer's own
        pieces (``Ġflies``), as the CSVs keep them."""
        trace = self.trace
        if self.words is None:
            return (trace.tokens if raw else trace.labels), trace.sentence_b_start
        words = self.words.words if raw else readable_tokens(self.words.words, trace.family.word_rule,
                                                             trace.byte_level)
        return words, self.words.word_start(trace.sentence_b_start)

    def reply_start(self) -> int | None:
        """Where a generated reply starts on the views' axes (tokens, or words when the toggle is on: the word that
        holds the reply's first token), or None for a typed-in text (``AttentionTrace.reply_start``)."""
        t = self.trace if self.kind == "full" else self.compact  # each resolves the cache once
        start = getattr(t, "reply_start", None)
        return start if start is None or self.words is None else self.words.word_start(start)

    def shown(self, matrix: np.ndarray) -> tuple[np.ndarray, tuple[str, ...], int | None]:
        """A query x key matrix of the trace as the views show it: merged into words when the toggle is on.

        Returns the matrix, its labels and where sentence B starts in it. Shape: (..., pos, pos) -> same or
        (..., word, word).
        """
        return (matrix if self.words is None else self.words.merge(matrix)), *self.labels()

    def weights(self) -> np.ndarray:
        """The trace's whole attention stack as the views show it (merged into words when the toggle is on).

        Shape: (layer, head, pos, pos) or (layer, head, word, word).
        """
        if self.words is None:
            return self.trace.weights
        from ui.derived import word_attentions

        return word_attentions(self.trace)

    @property
    def markers(self) -> Markers:
        """What this trace's family calls its marker tokens ([CLS]/[SEP], or a decoder's first token) and the
        token it reads out ([CLS], or a decoder's last token)."""
        return markers(self.trace if self.trace is not None else self.compact)

    @property
    def pieces(self) -> str:
        """What the tokenizer's pieces are called: "WordPieces" or "BPE pieces"."""
        return "WordPieces" if self.trace.family.word_rule == "wordpiece" else "BPE pieces"

    def words_note(self) -> str:
        """The words toggle's note for this trace: how many words from how many pieces, and how they merge."""
        decoder = self.trace.is_decoder
        how = ("a piece that starts with a space mark (Ġ or ▁) starts a new word, the others continue it" if
               self.trace.family.word_rule == "bpe" else "a piece with ## continues the word before it")
        count = f"{self.words.n_words} words from {self.trace.n_tokens} {self.pieces}" if self.words else "words"
        kept = "Special tokens stay" if decoder else "[CLS] and [SEP] stay"
        return (f"**Words, not {self.pieces}**: {count} ({how}). Attention to a word is the sum over its pieces; "
                "attention from a word is the mean over its pieces, so each row still sums to 1 (Clark et al., "
                f"2019). {kept} as they are.")

    def kv_sharing(self, head: int) -> str:
        """Which key/value head a query head reads and which heads share it (grouped-query attention), e.g.
        "Head 4 reads key/value head 1 (heads 3–5 share it)."."""
        kv_heads = np.asarray((self.trace if self.trace is not None else self.compact).kv_heads)
        kv = int(kv_heads[head])
        sharing = np.flatnonzero(kv_heads == kv).tolist()
        if len(sharing) == 1:
            return f"Head {head} has a key/value head of its own ({kv})."
        group = (f"heads {sharing[0]}–{sharing[-1]}" if sharing == list(range(sharing[0], sharing[-1] + 1))
                 else "heads " + ", ".join(map(str, sharing)))
        return f"Head {head} reads key/value head {kv} ({group} share it)."

    def masked(self) -> np.ndarray | None:
        """Where the model's mask forbids a query to see a key, as the views show it (a word may see a word when
        any of their pieces may), or None when nothing is masked. Shape: (pos, pos) or (word, word) bool."""
        allowed = np.asarray(self.trace.mask, dtype=bool)
        if allowed.all():
            return None
        if self.words is not None:
            member = self.words.membership()
            allowed = (member @ allowed.astype(np.float64) @ member.T) > 0
        return ~allowed

    def aggregate(self, how: str, layer: int = 0, head: int = 0) -> np.ndarray:
        """``model_core.analysis.aggregate.aggregate_heads`` of the stack as the views show it: with words on, a maximum
        over heads is the maximum of the heads' word matrices (merging after the maximum would sum the pieces'
        maxima). Shape: (pos, pos) or (word, word)."""
        from model_core.analysis.aggregate import aggregate_heads

        return aggregate_heads(self.weights(), how, layer, head)


def make_context(request: TraceRequest | None, settings: Settings, trace: AttentionTrace | CompactTrace | None,
                 error: str | None, **rest: Any) -> AppContext:
    """The context of a run that got ``trace`` (full or compact, from ``ui.loaders.TRACES``) for ``request``: the
    trace is held for the run (``hold``), the context keeps its key. ``rest``: the other fields."""
    if trace is None or request is None:
        return AppContext(request=request, settings=settings, error=error, **rest)
    kind: TraceKind = "compact" if isinstance(trace, CompactTrace) else "full"
    hold((kind, request), trace)
    return AppContext(request=request, settings=settings, error=error, kind=kind, n_layers=trace.n_layers,
                      n_heads=trace.n_heads, **rest)


def set_context(ctx: AppContext) -> None:
    """Store this full run's context (app.py, before the page runs); ``release_run`` ends the run."""
    begin_run()
    st.session_state[_KEY] = ctx


def get_context() -> AppContext:
    """The context app.py stored for this run."""
    track_page(sys._getframe(1).f_globals)
    return _stored_context()


def _stored_context() -> AppContext:
    if _KEY not in st.session_state:
        # Streamlit's legacy multipage mode runs a pages/ script alone when a fresh server's
        # first visitor opens a sub-page URL, before app.py has ever called st.navigation.
        leave_legacy_pages_mode()
    return st.session_state[_KEY]


def require_request() -> AppContext:
    """The context of a page that runs its own prompts (only the sidebar's model matters, so it reads the request,
    not its trace), or stop the page with the reason there is no request (the sidebar's options do not fit)."""
    track_page(sys._getframe(1).f_globals)
    ctx = _stored_context()
    if ctx.request is None:
        st.info(ctx.error or "Pick a model in the sidebar.", icon=":material/info:")
        st.stop()
    return ctx


def require_trace(compact: bool = False) -> AppContext:
    """The context, or stop the page with the reason there is no trace (the sidebar keeps working).

    A long input has only a compact trace: a page that reads it passes ``compact=True`` and checks ``ctx.compact``;
    any other page says its limit and where the compact form is drawn."""
    track_page(sys._getframe(1).f_globals)
    ctx = _stored_context()
    if ctx.compact is not None:
        if compact:
            return ctx
        from ui.compact import needs_full_trace

        needs_full_trace(ctx.compact, ctx.settings.full_trace_mb)
    if ctx.trace is None:
        st.info(ctx.error or "Type a sentence in the sidebar to see its attention.")
        st.stop()
    return ctx
