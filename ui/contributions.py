"""The Contributions page's cached pieces: one ``ContributionFlow`` per trace (its nodes kept, so a new threshold
only re-runs the walk), a layer's head maps, and the tokens a block promotes."""

from __future__ import annotations

from typing import Any

import numpy as np
import streamlit as st

from ui.trace_cache import per_trace


def _resolved(request: Any) -> Any:
    """The request's model from the app's caches (the copy its trace came from)."""
    from model_core.trace.resolve import resolve
    from ui.loaders import CACHED_MODELS

    return resolve(request, models=CACHED_MODELS)


@per_trace()
def cached_flow(trace: Any, request: Any) -> Any:
    """The trace's ``ContributionFlow``; a compact trace's runs one compact pass for the residual stream, with a
    progress bar."""
    from model_core.effects.graph_source import compact_flow, trace_flow

    resolved = _resolved(request)
    if not hasattr(trace, "lse"):
        return trace_flow(trace, resolved.model, resolved.family)
    bar = st.progress(0.0, text="Running the model once more for the residual stream…")
    n = trace.n_layers
    try:
        return compact_flow(trace, resolved.model, resolved.family,
                            lambda layer: bar.progress((layer + 1) / n, text=f"Residual stream: layer {layer + 1}/{n}"))
    finally:
        bar.empty()


def build(flow: Any, token: int, threshold: float) -> Any:
    """The graph of ``token``: only new nodes are computed (a spinner while they are)."""
    from model_core.effects.graph import build_graph

    with st.spinner("Computing the contributions of the nodes the graph reaches…"):
        return build_graph(flow, token, threshold)


def prefetch_lower(flow: Any, token: int, threshold: float) -> None:
    """Compute, in the flow's one background thread, the nodes a lower threshold would reach, so that moving the
    slider down then only re-runs the walk. A newer request supersedes one still running (``Prefetcher``)."""
    from model_core.effects.graph import Prefetcher

    prefetcher = flow.__dict__.get("_prefetcher")
    if prefetcher is None:
        prefetcher = flow.__dict__.setdefault("_prefetcher", Prefetcher(flow))
    prefetcher.request(int(token), float(threshold))


def layer_maps(flow: Any, layer: int, rows: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Each (key, head) term's share of the rows' resid_mid, and their attention weights, over every key.

    Shape: -> contrib (rows, head, key), weights (rows, head, key).
    """
    contrib = np.zeros((len(rows), flow.n_heads, flow.n_tokens), dtype=np.float32)
    for r, (heads, _) in enumerate(flow.attention(layer, rows)):
        contrib[r, :, : heads.shape[1]] = heads
    return contrib, flow.weights(layer, rows)


def block_tokens(flow: Any, request: Any, layer: int, position: int) -> Any:
    """The (attention, MLP) ``BlockTokens`` at one position (decoders)."""
    from model_core.effects.graph_tokens import block_tokens as compute

    resolved = _resolved(request)
    return compute(flow, resolved.model, resolved.family, resolved.tokenizer, layer, position)
