"""Results derived from a trace, cached by ``per_trace``: computed once per (trace, arguments) in this process.

A derived result (head statistics, the overview's mosaic, rollout and flow, the words' merged attention, the
next-token distribution, an export bundle, the corpus contexts nearest at every layer) depends on the trace and
a few hashable arguments only. ``per_trace`` keeps it with the trace object itself (a weak-keyed table): a rerun
that only changes the focused head reuses it, every session shares it (they share the trace, ``ui.loaders.TRACES``),
and it is freed when the trace leaves that cache, so derived results never outlive their trace (the words'
merged attention of a 512-token SmolLM2 trace is as large as its weights). Results are read-only: never mutate what
these return. ``trace_key`` names a trace by its content, for a page that remembers which trace it last showed.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, TypeVar

import numpy as np
import streamlit as st

from model_core import AttentionTrace
from model_core.analysis import HeadStats
from model_core.analysis import head_stats

R = TypeVar("R")


def trace_key(trace: AttentionTrace) -> str:
    """A string that identifies a trace: its model description (weights, shape, causal flag, LayerNorm
    placement), causal flag, tokens, where sentence B starts, and head mask."""
    mask = "".join("1" if on else "0" for on in trace.head_mask.ravel())
    return f"{trace.description}|{trace.causal}|{'␟'.join(trace.tokens)}|{trace.sentence_b_start}|{mask}"


_DERIVED: "weakref.WeakKeyDictionary[AttentionTrace, OrderedDict]" = weakref.WeakKeyDictionary()
_DERIVED_LOCK = threading.Lock()


def per_trace(*, spinner: str | bool = False, max_entries: int = 16) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Decorate ``fn(trace, *args)`` so it runs once per (trace, args) and is shared from then on, while the trace
    lives: at most ``max_entries`` argument tuples of ``fn`` per trace, the least recently used out first.

    ``args`` must be hashable (numbers, strings, tuples); ``spinner`` is shown while a result is computed.
    """

    def decorate(fn: Callable[..., R]) -> Callable[..., R]:
        name = f"{fn.__module__}.{fn.__qualname__}"

        @functools.wraps(fn)
        def call(trace: AttentionTrace, *args: Any) -> R:
            key = (name, args)
            with _DERIVED_LOCK:
                results = _DERIVED.setdefault(trace, OrderedDict())
                if key in results:
                    results.move_to_end(key)
                    return results[key]
            with st.spinner(spinner) if isinstance(spinner, str) else contextlib.nullcontext():
                value = fn(trace, *args)
            with _DERIVED_LOCK:
                results = _DERIVED.setdefault(trace, OrderedDict())
                results[key] = value
                mine = [k for k in results if k[0] == name]
                for old in mine[:max(0, len(mine) - max_entries)]:
                    del results[old]
            return value

        def clear() -> None:
            with _DERIVED_LOCK:
                for results in list(_DERIVED.values()):
                    for k in [k for k in results if k[0] == name]:
                        del results[k]

        call.clear = clear  # type: ignore[attr-defined]
        return call

    return decorate


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


@per_trace(spinner="Merging pieces into words…", max_entries=4)
def word_attentions(trace: AttentionTrace) -> np.ndarray:
    """Every head's attention merged into words (``model_core.words``). Shape: (layer, head, word, word)."""
    return _read_only(trace.words().merge(trace.weights))


@per_trace(max_entries=8)
def overview_mosaic_cells(trace: AttentionTrace, words: bool, max_cells: int) -> np.ndarray:
    """The overview's mosaic (``ui.figures.head_mosaic``) of the trace's tokens, or of its words."""
    from attention_explorer.figures import head_mosaic

    return _read_only(head_mosaic(word_attentions(trace) if words else trace.weights, max_cells))


@per_trace(max_entries=16)
def cached_head_stats(trace: AttentionTrace) -> HeadStats:
    """Clark et al.'s per-head statistics (``model_core.analysis.head_stats``)."""
    stats = head_stats(trace)
    for grid in stats.to_dict().values():
        grid.setflags(write=False)
    return stats


@per_trace(spinner="Computing attention flow…", max_entries=16)
def rollout_and_flow(trace: AttentionTrace) -> Any:
    """``model_core.analysis.rollout_and_flow`` of a trace (flow takes seconds), with the relevance to the token
    the family reads out: [CLS], or a decoder's last token (``model_core.analysis.markers``)."""
    from model_core.analysis import markers
    from model_core.analysis import rollout_and_flow as compute

    return compute(trace.weights, trace.head_mask, target=markers(trace).readout)


@per_trace(spinner="Reading the next-token distribution…", max_entries=16)
def next_token_distribution(trace: AttentionTrace, model_id: str) -> np.ndarray:
    """A decoder's whole next-token distribution at its last token (``model_core.analysis.next_token_probs``),
    from the cached model ``model_id``. Shape: (vocab,)."""
    from model_core.analysis import next_token_probs
    from ui.loaders import CACHED_MODELS, device

    loaded = CACHED_MODELS.pretrained(model_id, device())
    return _read_only(next_token_probs(loaded.family, loaded.model, trace, -1))


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


@per_trace(spinner="Searching the corpus at every layer…", max_entries=32)
def neighbours_by_layer(trace: AttentionTrace, run_path: str, stamp: float, position: int,
                        k: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """For every layer of the trace's hidden states, the ``k`` corpus tokens of the run at ``run_path`` nearest to
    ``trace.tokens[position]`` (``model_core.corpus.neighbours.neighbours_of``): the share that are the same token,
    the mean cosine, and the first three as text. ``stamp`` is the run's manifest time, so a changed run is new.

    Shape: (hidden layer,), (hidden layer,), and a list of hidden-layer strings.
    """
    from model_core.corpus.neighbours import neighbours_of
    from ui.corpus import open_cached

    run = open_cached(run_path)
    same, score, tops = [], [], []
    for layer in range(trace.hidden_states.shape[0]):
        found = neighbours_of(run, trace.hidden_states, trace.tokens, position=position, layer=layer, k=k)
        same.append(np.mean([f["token"] == trace.tokens[position] for f in found]) if found else 0.0)
        score.append(np.mean([f["score"] for f in found]) if found else 0.0)
        tops.append(" · ".join(f"{f['token']}: {f['text'][:50]}" for f in found[:3]))
    return _read_only(np.array(same)), _read_only(np.array(score)), tops
