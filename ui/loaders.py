"""Cached loaders: one model copy per process (on the GPU if any), one trace per inputs."""

from __future__ import annotations

from typing import Any

import streamlit as st

from model_core import AttentionTrace, CustomSpec, build_custom_model, encode, load_pretrained, trace_bert, trace_custom
from model_core.loading import LoadedModel, load_tokenizer, select_device
from model_core.settings import load_settings
from model_core.tracing import describe_custom

# Traces are immutable (read-only arrays), so all sessions can share one copy: a cache_data
# copy per session would multiply memory by the number of users (a 512-token bert-base trace
# is ~230 MB). The bound keeps memory flat however many texts come in.
TRACE_CACHE_ENTRIES = 24
TRACE_TTL_S = 3600


@st.cache_resource(max_entries=4, show_spinner=False)
def get_bert(model_id: str) -> LoadedModel:
    """The pretrained BERT, loaded once per process on the settings' device."""
    return load_pretrained(model_id)


@st.cache_resource(max_entries=4, show_spinner=False)
def get_custom_model(spec: CustomSpec) -> Any:
    """The custom encoder for ``spec``, built once per process on the settings' device."""
    return build_custom_model(spec, select_device(load_settings().device))


@st.cache_resource(max_entries=TRACE_CACHE_ENTRIES, ttl=TRACE_TTL_S, show_spinner=False)
def get_trace(
    model: str,
    model_id: str | None,
    text_a: str,
    text_b: str,
    truncate: bool = False,
    weights: str = "random",
    seed: int = 0,
    causal: bool = False,
    norm_placement: str = "pre",
    num_layers: int = 12,
    num_heads: int = 12,
    hidden_size: int = 768,
    head_mask: tuple[tuple[bool, ...], ...] | None = None,
) -> AttentionTrace:
    """Run the model once for these inputs; every page and view reads this same trace.

    Raises:
        InputError, ModelLoadError, ValueError: with a message for the user.
    """
    import numpy as np

    settings = load_settings()
    hm = None if head_mask is None else np.array(head_mask, dtype=bool)
    if model == "bert":
        loaded = get_bert(model_id or settings.default_model)
        limit = min(settings.max_tokens, loaded.model.config.max_position_embeddings)
        encoded = encode(loaded.tokenizer, text_a, text_b, max_tokens=limit, truncate=truncate)
        return trace_bert(loaded, encoded, hm)
    spec = CustomSpec(weights=weights, seed=seed, causal=causal, norm_placement=norm_placement,
                      num_layers=num_layers, num_heads=num_heads, hidden_size=hidden_size,
                      model_id=model_id if weights == "pretrained" else None)
    custom = get_custom_model(spec)
    tokenizer = get_bert(spec.model_id).tokenizer if spec.model_id else load_tokenizer()
    limit = min(settings.max_tokens, custom.config.max_position_embeddings)
    encoded = encode(tokenizer, text_a, text_b, max_tokens=limit, truncate=truncate)
    return trace_custom(custom, encoded, describe_custom(spec, custom), hm)
