"""Results derived from a trace, cached by ``ui.trace_cache.per_trace``: computed once per (trace, arguments).

A derived result (head statistics, the overview's mosaic, rollout and flow, the words' merged attention, the
next-token distribution, an export bundle, the corpus contexts nearest at every layer) depends on the trace and
a few hashable arguments only. ``per_trace`` keeps it in the one per-trace cache (``ui.trace_cache.DERIVED``, bounded
by bytes): a rerun that only changes the focused head reuses it, every session shares it (they share the trace,
``ui.loaders.TRACES``), and it is dropped when its trace is freed. Results are read-only: never mutate what these
return. ``trace_key`` names a trace by its content, for a page that remembers which trace it last showed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from model_core import AttentionTrace
from model_core.analysis import HeadStats
from model_core.analysis import head_stats
from ui.trace_cache import per_trace, trace_key

__all__ = ["per_trace", "trace_key", "word_attentions", "overview_mosaic_cells", "cached_head_stats",
           "cached_special_token_mass", "rollout_and_flow", "next_token_distribution", "analysis_bundle",
           "neighbours_by_layer"]


def _read_only(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


@per_trace(spinner="Merging pieces into words…")
def word_attentions(trace: AttentionTrace) -> np.ndarray:
    """Every head's attention merged into words (``model_core.words``). Shape: (layer, head, word, word)."""
    return _read_only(trace.words().merge(trace.weights))


@per_trace()
def overview_mosaic_cells(trace: AttentionTrace, words: bool, max_cells: int) -> np.ndarray:
    """The overview's mosaic (``attention_explorer.figures.head_mosaic``) of the trace's tokens, or of its words."""
    from attention_explorer.figures import head_mosaic

    return _read_only(head_mosaic(word_attentions(trace) if words else trace.weights, max_cells))


@per_trace()
def cached_head_stats(trace: AttentionTrace) -> HeadStats:
    """Clark et al.'s per-head statistics (``model_core.analysis.head_stats``)."""
    stats = head_stats(trace)
    for grid in stats.to_dict().values():
        grid.setflags(write=False)
    return stats


@per_trace()
def cached_special_token_mass(trace: AttentionTrace) -> Any:
    """The share of raw and norm-weighted attention on the special tokens
    (``model_core.analysis.special_token_mass``)."""
    from model_core.analysis import special_token_mass

    return special_token_mass(trace)


@per_trace(spinner="Computing attention flow…")
def rollout_and_flow(trace: AttentionTrace) -> Any:
    """``model_core.analysis.rollout_and_flow`` of a trace (flow takes seconds), with the relevance to the token
    the family reads out: [CLS], or a decoder's last token (``model_core.analysis.markers``)."""
    from model_core.analysis import markers
    from model_core.analysis import rollout_and_flow as compute

    return compute(trace.weights, trace.head_mask, target=markers(trace).readout)


@per_trace(spinner="Reading the next-token distribution…")
def next_token_distribution(trace: AttentionTrace, model_id: str) -> np.ndarray:
    """A decoder's whole next-token distribution at its last token (``model_core.analysis.next_token_probs``),
    from the cached model ``model_id``. Shape: (vocab,)."""
    from model_core.analysis import next_token_probs
    from ui.loaders import CACHED_MODELS, device

    loaded = CACHED_MODELS.pretrained(model_id, device())
    return _read_only(next_token_probs(loaded.family, loaded.model, trace, -1))


@per_trace(spinner="Preparing the export…")
def analysis_bundle(trace: AttentionTrace) -> tuple[bytes, str]:
    """The whole analysis of a trace as (NPZ bytes, JSON text)."""
    from model_core.analysis import analysis_arrays
    from model_core.analysis.export import JSON_MAX_TOKENS_PER_HEAD
    from model_core.io.export import to_json_str, to_npz_bytes

    arrays = analysis_arrays(trace)
    for_json: dict[str, Any] = dict(arrays)
    if trace.n_tokens > JSON_MAX_TOKENS_PER_HEAD:
        for_json["norm_weighted"] = f"left out past {JSON_MAX_TOKENS_PER_HEAD} tokens: use the NPZ"
    return to_npz_bytes(arrays), to_json_str(for_json)


@per_trace(spinner="Searching the corpus at every layer…")
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
