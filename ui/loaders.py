"""Cached loaders: one model copy per process (on the GPU if any), one trace and one walk per request.

These only cache: ``model_core.build_trace`` and ``model_core.build_walkthrough`` do the work, with the
models taken from this module's ``st.cache_resource`` loaders (``CACHED_MODELS``), so Streamlit's one cache
decides which models stay in memory.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator
from typing import Any

import streamlit as st
import torch
from threadpoolctl import threadpool_limits

from model_core import (
    AttentionTrace,
    CustomSpec,
    Models,
    TraceRequest,
    build_trace,
    build_walkthrough,
)
from model_core.analysis.masked_run import MaskedRun, run_masked
from model_core.walk.decoder import DecoderWalk
from model_core.compact.trace import CompactTrace
from model_core.compact.build import build_compact, trace_form
from model_core.compact.views import TraceForm
from model_core.models.custom import build_custom_model
from model_core.models.loading import LoadedModel, load_pretrained_uncached, select_device
from model_core.models.memory import BoundedCache, release_freed_memory
from model_core.analysis.predictions import LogitLens, logit_lens
from model_core.settings import BUNDLED_DECODER_ID, Settings, load_settings
from model_core.trace.resolve import model_id_of
from model_core.walk.encoder import Walkthrough
from ui.trace_cache import per_trace, stoppable
from ui.waiting import Note, in_turn

# Traces are immutable (read-only arrays), so all sessions share one copy: a cache_data copy per session would
# multiply memory by the number of users. Finished and compact traces share one cache bounded by bytes
# (AE_TRACE_CACHE_MB, 512 MB by default; head masking's runs a quarter of it beside): a count of entries let the
# server grow by 0.4 GB with each new 512-token SmolLM2 text (6.2 GB after ten). What each trace's pages derive from
# it (``ui.trace_cache``) goes with it.
TRACE_CACHE_ENTRIES = 12
TRACE_TTL_S = 3600


def _trace_budget() -> float:
    return load_settings().trace_cache_mb * 1e6


_RUN = threading.local()  # per script thread: whether this run let a trace go (``collect_after_run``)


def _evicted() -> None:
    _RUN.collect = True


TRACES: BoundedCache = BoundedCache(_trace_budget, max_entries=TRACE_CACHE_ENTRIES, ttl_s=TRACE_TTL_S,
                                    on_evict=_evicted)
"""The one cache of finished traces: keys ("full" | "compact", request)."""

MASKED_RUNS: BoundedCache = BoundedCache(lambda: _trace_budget() / 4, max_entries=8, ttl_s=TRACE_TTL_S,
                                         on_evict=_evicted)
"""Head masking's runs (~37 MB for SmolLM2 at 512 tokens), bounded apart from the traces so that a run never pushes
its own baseline out of ``TRACES`` (and the baseline never its run)."""

# A walk holds one layer's tensors (a 512-token bert-base layer is ~60 MB), so a few suffice:
# the user moves between layers of one input, rarely back to an old input.
WALK_CACHE_ENTRIES = 8
WALKS: BoundedCache = BoundedCache(lambda: _trace_budget() / 4, max_entries=WALK_CACHE_ENTRIES, ttl_s=TRACE_TTL_S,
                                   on_evict=_evicted)
"""Inside the model's walks, keys (request, layer): ~58 MB for a SmolLM2 block at 512 tokens, ~50 MB for a layer of
the chapter-3 encoder; a walk of another layer takes 0.02-1.3 s, so a few are kept, bounded by bytes."""


COLLECT_DELAY_S = 1.0


def cpu_threads() -> int:
    """Threads for torch's CPU kernels in the server: half the cores (at least 1), unless set.

    Measured on a 2-core machine shared with other jobs (bench/bench_app.py): a 512-token bert-base
    forward pass takes 0.6 s with 2 threads when the machine is quiet but 7-20 s when another job
    or another session holds a core (OpenMP threads wait on each other), and a steady 1.0-1.3 s
    with 1 thread. A server runs several sessions' forward passes side by side, so it keeps half
    the cores free. OMP_NUM_THREADS (or AE_TORCH_THREADS) overrides.
    """
    return _env_threads() or max(1, (os.cpu_count() or 2) // 2)


def _env_threads() -> int | None:
    """The threads AE_TORCH_THREADS (or else OMP_NUM_THREADS) sets, or None."""
    for name in ("AE_TORCH_THREADS", "OMP_NUM_THREADS"):
        raw = os.environ.get(name, "").strip()
        if raw.isdigit() and int(raw) > 0:
            return int(raw)
    return None


CPU_THREADS = cpu_threads()
torch.set_num_threads(CPU_THREADS)
# numpy's BLAS (OpenBLAS) starts a thread per core of its own. When the browser or another session holds a core,
# its threads spin waiting for each other: the heatmaps page's per-head statistics (30 small matrix products) took
# 2.7 s instead of 0.5 s with SmolLM2 at 512 tokens. Hold it to torch's threads.
_BLAS_LIMIT = threadpool_limits(CPU_THREADS, user_api="blas")


@contextlib.contextmanager
def all_cores_for_generation() -> Iterator[None]:
    """Every core for torch's kernels while a reply is generated, then ``CPU_THREADS`` again, unless
    AE_TORCH_THREADS or OMP_NUM_THREADS sets the threads.

    A generation step is one token through every layer: each of its small kernels splits over the cores, and the gate
    runs one pass at a time, so the cores the server keeps free for other sessions' passes (``cpu_threads``) are
    free anyway. Measured in the app on a 2-core machine with the browser beside it, after a 530-token prompt: 15.0
    tokens/s with 1 thread, 16.2-18.9 with 2. The setting is torch's (OpenMP's), not only this thread's: another
    session's pass between two steps may run with it too.
    """
    wide = max(1, os.cpu_count() or 1)
    if _env_threads() is not None or wide <= CPU_THREADS:
        yield
        return
    torch.set_num_threads(wide)
    try:
        yield
    finally:
        torch.set_num_threads(CPU_THREADS)


def device() -> torch.device:
    """The settings' device: cuda, then mps, then cpu."""
    return select_device(load_settings().device)


@st.cache_resource(max_entries=4, show_spinner=False)
def get_pretrained(model_id: str, device_name: str) -> LoadedModel:
    """A pretrained model (any family), loaded once per process and device."""
    return load_pretrained_uncached(model_id, device=device_name)


@st.cache_resource(max_entries=4, show_spinner=False)
def get_custom_model(spec: CustomSpec, device_name: str) -> Any:
    """The custom encoder for ``spec``, built once per process and device."""
    return build_custom_model(spec, device_name)


CACHED_MODELS = Models(pretrained=lambda model_id, dev: get_pretrained(model_id, str(dev)),
                custom=lambda spec, dev: get_custom_model(spec, str(dev)))
"""The app's models, from the two caches above: ``build_trace`` takes them, and so does the corpus page."""


def collect_after_run(force: bool = False) -> None:
    """After a run that let a trace go out of ``TRACES`` or ``MASKED_RUNS`` (or ``force``: it let go of earlier
    runs' callbacks, ``ui.state``): collect the garbage of the runs before it, a moment later, in the background.

    A page script lives on in reference cycles (its callbacks and fragments point back at the page's globals,
    which hold its trace), and ``runner.postScriptGC`` is off (a full collection after every run cost ~0.1 s of
    each head change). So when a new trace pushed an old one out of ``TRACES``, the old one stayed until Python's
    rare full collection: one more 512-token SmolLM2 trace (0.4 GB) after every new text. A full collection takes
    ~0.3 s with the model loaded and holds the interpreter: it runs ``COLLECT_DELAY_S`` after the run, once the
    page's messages are sent and while the browser draws them.
    """
    if not (getattr(_RUN, "collect", False) or force):
        return
    _RUN.collect = False

    def collect() -> None:
        gc.collect()
        release_freed_memory()

    timer = threading.Timer(COLLECT_DELAY_S, collect)
    timer.daemon = True
    timer.start()


def get_trace(request: TraceRequest) -> AttentionTrace:
    """Run the model once for this request; every page and view reads this same trace (``TRACES``).

    Raises:
        InputError, ModelLoadError, ValueError: with a message for the user.
    """
    # On a miss the pass waits its turn at the gate, the page showing its place (``ui.waiting``); a hit never waits.
    def build() -> AttentionTrace:
        # Before the turn: a model load must not hold the one turn every user waits for. The spinner shows only
        # when loading takes over half a second (a model's first use on this server).
        with st.spinner(f"Loading {_model_name(request)} (its first use on this server only)…"):
            _load_models(request)
        return in_turn(f"full|{request!r}", lambda: build_trace(request, models=CACHED_MODELS))

    return TRACES.get(("full", request), build, wait=stoppable)


def _model_name(request: TraceRequest) -> str:
    """The request's model as the loading spinner names it."""
    if request.model == "custom":
        return "the chapter-3 encoder" + (" with BERT's weights" if request.weights == "pretrained" else "")
    return model_id_of(request, load_settings()).removeprefix("bundled:")


def _load_models(request: TraceRequest, walk: bool = False) -> None:
    """Load (or build) the request's model into the process's cache, outside the gate's turn."""
    from model_core.trace.resolve import resolve

    resolve(request, device=device(), models=CACHED_MODELS, walk=walk)


get_trace.clear = TRACES.clear  # type: ignore[attr-defined]


def get_trace_form(request: TraceRequest) -> TraceForm:
    """Full or compact for this request (``model_core.compact.build.trace_form``): the text is tokenised, the model
    comes from the cache."""
    return trace_form(request, models=CACHED_MODELS)


def get_compact(request: TraceRequest, progress: Any = None, note: Note | None = None) -> CompactTrace:
    """The compact trace of a long input (``model_core.compact.trace``), once per request and process; ``progress`` is
    called with ("forward" | "summary", fraction done) while it is built; ``note`` shows its place in the gate's queue
    while it waits (``ui.waiting.in_turn``).

    In ``TRACES``, not ``st.cache_resource``: the progress bar is drawn while the function runs, which Streamlit's
    cache would replay on a hit; a cancelled build (Streamlit stops the run) stores nothing.

    Raises:
        InputError, ModelLoadError, ValueError: with a message for the user.
    """
    # No page reads the next-token predictions of a long input, and only the head statistics page the largest
    # weight (it computes that on request): leaving both out saves about a third of the trace's time.
    return TRACES.get(("compact", request), lambda: in_turn(f"compact|{request!r}", lambda: build_compact(
        request, models=CACHED_MODELS, max_tokens=load_settings().max_tokens, progress=progress,
        predictions=False, largest_weight=False), note), wait=stoppable)


def get_masked_run(request: TraceRequest, off: tuple[tuple[int, int], ...]) -> MaskedRun:
    """The lean second run of head masking (``model_core.analysis.masked_run``): the tokens of
    ``get_trace(request)`` with the heads in ``off`` switched off.

    Raises:
        InputError, ModelLoadError, ValueError: as ``get_trace``.
    """
    from model_core.analysis.masking import head_mask_from_off

    baseline = get_trace(request)
    mask = head_mask_from_off(baseline.n_layers, baseline.n_heads, off)
    return MASKED_RUNS.get((request, off), lambda: in_turn(f"masked|{request!r}|{off}", lambda: run_masked(
        request, baseline, mask, models=CACHED_MODELS)), wait=stoppable)


def get_walkthrough(request: TraceRequest, layer: int) -> Walkthrough | DecoderWalk:
    """The walk through ``layer`` for the tokens of ``get_trace(request)``: in ``request.walk_spec()``'s encoder, or
    through a decoder's own block.

    Raises:
        InputError, ModelLoadError, ValueError: as ``get_trace``; ValueError for a bad layer or a decoder family
            with no block walk.
    """
    def build() -> Walkthrough | DecoderWalk:
        trace = get_trace(request)  # before the turn: holding it while another session builds this trace would stall
        _load_models(request, walk=not trace.is_decoder)  # the encoder walk's chapter-3 encoder (BERT's weights)
        return in_turn(f"walk|{request!r}|{layer}", lambda: build_walkthrough(request, layer, trace,
                                                                              models=CACHED_MODELS))

    return WALKS.get((request, layer), build, wait=stoppable)


get_walkthrough.clear = WALKS.clear  # type: ignore[attr-defined]


def prepare_bundled_decoder(model_id: str) -> None:
    """Before the bundled decoder's first load: convert it from its GGUF file (once per machine, about a minute),
    showing each step in a status box. Returns at once for any other model, or when the conversion is done.

    Raises:
        ModelLoadError: the conversion cannot run; the message says what to do.
    """
    from model_core.models import bundled

    if model_id != BUNDLED_DECODER_ID or bundled.is_complete(bundled.bundled_decoder_dir()):
        return
    label = "Converting SmolLM2-135M-Instruct from its GGUF file, once (about a minute; later loads take a second)…"
    with st.status(label, expanded=True) as status:
        try:
            bundled.ensure_bundled_decoder(progress=status.write)
        except Exception:
            status.update(label="Converting SmolLM2-135M-Instruct failed", state="error")
            raise
        status.update(label="SmolLM2-135M-Instruct is converted and ready.", state="complete", expanded=False)


def pretrained_key(request: TraceRequest, settings: Settings | None = None) -> tuple[str, str]:
    """(model id, device name): the ``get_pretrained`` arguments of a pretrained request's model, as ``get_trace``
    passes them (through ``CACHED_MODELS``), so a page reaches the very copy the trace came from, never a second.

    Raises:
        ValueError: the request is for the custom encoder.
    """
    if request.model != "pretrained":
        raise ValueError("The custom encoder is not a pretrained model; pick \"Pretrained model\" in the sidebar.")
    settings = settings or load_settings()
    return model_id_of(request, settings), str(select_device(settings.device))


def pretrained_for(request: TraceRequest, settings: Settings | None = None) -> LoadedModel:
    """The cached model a pretrained request's trace came from (``pretrained_key``).

    Raises:
        ValueError: the request is for the custom encoder.
    """
    return get_pretrained(*pretrained_key(request, settings))


@per_trace(spinner="Reading the residual stream through the unembedding…")
def get_logit_lens(trace: AttentionTrace, model_id: str, device_name: str, position: int, k: int) -> LogitLens:
    """``model_core.analysis.predictions.logit_lens`` of ``trace`` at ``position``, once per (trace, position, k), with the
    cached model ``get_pretrained(model_id, device_name)``."""
    return logit_lens(get_pretrained(model_id, device_name), trace, position, k)
