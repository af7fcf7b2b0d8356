"""Cached loaders: one model copy per process (on the GPU if any), one trace per inputs."""

from __future__ import annotations

import os
from typing import Any

import streamlit as st
import torch

from model_core import AttentionTrace, CustomSpec, build_custom_model, encode, load_pretrained, trace_bert, trace_custom
from model_core.loading import LoadedModel, load_tokenizer, select_device
from model_core.memory import release_freed_memory
from model_core.settings import load_settings
from model_core.tracing import describe_custom

# Traces are immutable (read-only arrays), so all sessions can share one copy: a cache_data
# copy per session would multiply memory by the number of users (a 512-token bert-base trace
# is ~230 MB). The bound keeps memory flat however many texts come in: at most 12 traces, so
# ~2.7 GB in the worst case (twelve 512-token bert-base traces), ~120 MB at 128 tokens on MiniLM.
TRACE_CACHE_ENTRIES = 12
TRACE_TTL_S = 3600


def cpu_threads() -> int:
    """Threads for torch's CPU kernels in the server: half the cores (at least 1), unless set.

    Measured on a 2-core machine shared with other jobs (bench/bench_app.py): a 512-token bert-base
    forward pass takes 0.6 s with 2 threads when the machine is quiet but 7-20 s when another job
    or another session holds a core (OpenMP threads wait on each other), and a steady 1.0-1.3 s
    with 1 thread. A server runs several sessions' forward passes side by side, so it keeps half
    the cores free. OMP_NUM_THREADS (or AE_TORCH_THREADS) overrides.
    """
    for name in ("AE_TORCH_THREADS", "OMP_NUM_THREADS"):
        raw = os.environ.get(name, "").strip()
        if raw.isdigit() and int(raw) > 0:
            return int(raw)
    return max(1, (os.cpu_count() or 2) // 2)


torch.set_num_threads(cpu_threads())


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
        trace = trace_bert(loaded, encoded, hm)
        release_freed_memory()  # glibc keeps each session thread's freed buffers in its own arena
        return trace
    spec = CustomSpec(weights=weights, seed=seed, causal=causal, norm_placement=norm_placement,
                      num_layers=num_layers, num_heads=num_heads, hidden_size=hidden_size,
                      model_id=model_id if weights == "pretrained" else None)
    custom = get_custom_model(spec)
    tokenizer = get_bert(spec.model_id).tokenizer if spec.model_id else load_tokenizer()
    limit = min(settings.max_tokens, custom.config.max_position_embeddings)
    encoded = encode(tokenizer, text_a, text_b, max_tokens=limit, truncate=truncate)
    trace = trace_custom(custom, encoded, describe_custom(spec, custom), hm)
    release_freed_memory()
    return trace
