"""Cached loaders: one model copy per process (on the GPU if any), one trace and one walk per request.

These only cache: ``model_core.build_trace`` and ``model_core.build_walkthrough`` do the work, with the
models taken from this module's ``st.cache_resource`` loaders (``MODELS``), so Streamlit's one cache
decides which models stay in memory.
"""

from __future__ import annotations

import os
from typing import Any

import streamlit as st
import torch

from model_core import AttentionTrace, CustomSpec, Models, TraceRequest, build_trace, build_walkthrough
from model_core.custom_spec import build_custom_model
from model_core.loading import LoadedModel, read_pretrained, select_device
from model_core.memory import release_freed_memory
from model_core.settings import load_settings
from model_core.walkthrough import Walkthrough

# Traces are immutable (read-only arrays), so all sessions can share one copy: a cache_data
# copy per session would multiply memory by the number of users (a 512-token bert-base trace
# is ~230 MB). The bound keeps memory flat however many texts come in: at most 12 traces, so
# ~2.7 GB in the worst case (twelve 512-token bert-base traces), ~120 MB at 128 tokens on MiniLM.
TRACE_CACHE_ENTRIES = 12
TRACE_TTL_S = 3600
# A walk holds one layer's tensors (a 512-token bert-base layer is ~60 MB), so a few suffice:
# the user moves between layers of one input, rarely back to an old input.
WALK_CACHE_ENTRIES = 8


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


def device() -> torch.device:
    """The settings' device: cuda, then mps, then cpu."""
    return select_device(load_settings().device)


@st.cache_resource(max_entries=4, show_spinner=False)
def get_bert(model_id: str, device_name: str) -> LoadedModel:
    """The pretrained BERT, loaded once per process and device."""
    return read_pretrained(model_id, device=device_name)


@st.cache_resource(max_entries=4, show_spinner=False)
def get_custom_model(spec: CustomSpec, device_name: str) -> Any:
    """The custom encoder for ``spec``, built once per process and device."""
    return build_custom_model(spec, device_name)


MODELS = Models(bert=lambda model_id, dev: get_bert(model_id, str(dev)),
                custom=lambda spec, dev: get_custom_model(spec, str(dev)))
"""The app's models, from the two caches above: ``build_trace`` takes them, and so does the corpus page."""


@st.cache_resource(max_entries=TRACE_CACHE_ENTRIES, ttl=TRACE_TTL_S, show_spinner=False)
def get_trace(request: TraceRequest) -> AttentionTrace:
    """Run the model once for this request; every page and view reads this same trace.

    Raises:
        InputError, ModelLoadError, ValueError: with a message for the user.
    """
    trace = build_trace(request, models=MODELS)
    release_freed_memory()  # glibc keeps each session thread's freed buffers in its own arena
    return trace


@st.cache_resource(max_entries=WALK_CACHE_ENTRIES, ttl=TRACE_TTL_S, show_spinner=False)
def get_walkthrough(request: TraceRequest, layer: int) -> Walkthrough:
    """The walk through ``layer`` for the tokens of ``get_trace(request)``, in ``request.walk_spec()``'s encoder.

    Raises:
        InputError, ModelLoadError, ValueError: as ``get_trace``; ValueError for a bad layer.
    """
    return build_walkthrough(request, layer, get_trace(request), models=MODELS)
