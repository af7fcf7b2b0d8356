"""Cached loader of the "Inside the encoder" walk: one Walkthrough per (model, inputs, layer)."""

from __future__ import annotations

import streamlit as st

from model_core import CustomSpec
from model_core.walkthrough import Walkthrough, encoded_from_trace, walk_layer
from ui.loaders import get_custom_model, get_trace

# A walk holds one layer's tensors (a 512-token bert-base layer is ~60 MB), so a few suffice:
# the user moves between layers of one input, rarely back to an old input.
WALK_CACHE_ENTRIES = 8
WALK_TTL_S = 3600


def walk_spec(model: str, model_id: str | None, weights: str = "random", seed: int = 0, causal: bool = False,
              norm_placement: str = "pre", num_layers: int = 12, num_heads: int = 12,
              hidden_size: int = 768) -> CustomSpec:
    """The from-scratch encoder a walk runs in.

    For ``model="bert"`` that is BERT's weights loaded into the custom encoder (post-LN, classifier
    head random with seed 0): the same spec ``get_trace`` builds for the sidebar's "Loaded from
    BERT" with seed 0 and no causal mask, so the two share one cached model.
    """
    if model == "bert":
        return CustomSpec(weights="pretrained", seed=0, causal=False, norm_placement="post", model_id=model_id)
    pretrained = weights == "pretrained"
    return CustomSpec(weights=weights, seed=seed, causal=causal, norm_placement=norm_placement,
                      num_layers=num_layers, num_heads=num_heads, hidden_size=hidden_size,
                      model_id=model_id if pretrained else None)


@st.cache_resource(max_entries=WALK_CACHE_ENTRIES, ttl=WALK_TTL_S, show_spinner=False)
def get_walkthrough(layer: int, model: str, model_id: str | None, text_a: str, text_b: str,
                    truncate: bool = False, **options) -> Walkthrough:
    """The walk through ``layer`` for the inputs of ``ui.loaders.get_trace(model, ..., **options)``.

    The tokens come from that (cached) trace, so the walk reads exactly what every page reads;
    the model comes from ``get_custom_model``'s cache.

    Raises:
        InputError, ModelLoadError, ValueError: as ``get_trace``; ValueError for a bad layer.
    """
    trace = get_trace(model, model_id, text_a, text_b, truncate, **options)
    custom = get_custom_model(walk_spec(model, model_id, **options))
    return walk_layer(custom, encoded_from_trace(trace), layer)
