"""The one way to cache what is derived from a trace: computed once per trace, shared by every session.

A derived result (head statistics, the pooled overview, rollout and flow, the words' merged attention, an
export bundle) is a pure function of a trace. ``per_trace`` caches it in ``st.cache_resource`` under the
trace's key, so a rerun that only changes the focused head reuses it, and Streamlit's bounded cache frees it
(no hand-made weakref caches). Results are read-only: never mutate what these return.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import numpy as np
import streamlit as st

from model_core import AttentionTrace
from model_core.analysis import HeadStats
from model_core.analysis import head_stats as _head_stats
from model_core.words import word_spans

R = TypeVar("R")
DERIVED_TTL_S = 3600


def trace_key(trace: AttentionTrace) -> str:
    """A string that identifies a trace: its model description, tokens and head mask."""
    mask = "".join("1" if on else "0" for on in trace.head_mask.ravel())
    return f"{trace.description}|{trace.causal}|{'␟'.join(trace.tokens)}|{trace.sentence_b_start}|{mask}"


def per_trace(*, spinner: str | bool = False, max_entries: int = 16) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Decorate ``fn(trace, *args)`` so it runs once per (trace, args) and is shared from then on.

    ``args`` must be hashable by Streamlit (numbers, strings, tuples); the trace is keyed by ``trace_key``.
    """

    def decorate(fn: Callable[..., R]) -> Callable[..., R]:
        def cached(key: str, args: tuple, _trace: AttentionTrace) -> R:
            return fn(_trace, *args)

        # Streamlit tells cached functions apart by module and qualified name: give each its own.
        cached.__module__, cached.__qualname__ = fn.__module__, f"{fn.__qualname__}.per_trace"
        cached = st.cache_resource(max_entries=max_entries, ttl=DERIVED_TTL_S, show_spinner=spinner)(cached)

        @functools.wraps(fn)
        def call(trace: AttentionTrace, *args: Any) -> R:
            return cached(trace_key(trace), args, trace)

        call.clear = cached.clear  # type: ignore[attr-defined]
        return call

    return decorate


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


@per_trace(spinner="Merging WordPieces into words…", max_entries=4)
def word_attentions(trace: AttentionTrace) -> np.ndarray:
    """Every head's attention merged into words (``model_core.words``). Shape: (layer, head, word, word)."""
    return _read_only(word_spans(trace.tokens).merge(trace.attentions))


@per_trace(max_entries=8)
def overview_mosaic_cells(trace: AttentionTrace, words: bool, max_cells: int) -> np.ndarray:
    """The overview's mosaic (``ui.figures.head_mosaic``) of the trace's tokens, or of its words."""
    from ui.figures import head_mosaic

    return _read_only(head_mosaic(word_attentions(trace) if words else trace.attentions, max_cells))


@per_trace(max_entries=16)
def head_stats(trace: AttentionTrace) -> HeadStats:
    """Clark et al.'s per-head statistics (``model_core.analysis.head_stats``)."""
    stats = _head_stats(trace)
    for grid in stats.to_dict().values():
        grid.setflags(write=False)
    return stats


@per_trace(spinner="Computing attention flow…", max_entries=16)
def rollout_and_flow(trace: AttentionTrace) -> Any:
    """``model_core.analysis.rollout_and_flow`` of a trace (flow takes seconds)."""
    from model_core.analysis import rollout_and_flow as compute

    return compute(trace.attentions, trace.head_mask)


@per_trace(spinner="Preparing the export…", max_entries=16)
def analysis_bundle(trace: AttentionTrace) -> tuple[bytes, str]:
    """The whole analysis of a trace as (NPZ bytes, JSON text)."""
    from model_core.analysis import analysis_arrays, to_json_str, to_npz_bytes
    from model_core.analysis.export import JSON_MAX_TOKENS_PER_HEAD

    arrays = analysis_arrays(trace)
    for_json: dict[str, Any] = dict(arrays)
    if trace.n_tokens > JSON_MAX_TOKENS_PER_HEAD:
        for_json["norm_weighted"] = f"left out past {JSON_MAX_TOKENS_PER_HEAD} tokens: use the NPZ"
    return to_npz_bytes(arrays), to_json_str(for_json)
