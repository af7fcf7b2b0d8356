"""The one cache of what pages derive from a trace, full or compact: ``per_trace``, bounded by bytes.

A derived result (head statistics, the overview's mosaic, rollout, a compact trace's pooled head or rollout row, role
scores...) depends on the trace and a few hashable arguments only. ``per_trace`` computes it once per (trace, function,
arguments) and every session shares it (they share the trace, ``ui.loaders.TRACES``). The entries live in one
``BoundedCache`` (``DERIVED``) keyed by the trace's content (``trace_key``: a full trace's or a compact trace's),
bounded by the bytes they hold (half of AE_TRACE_CACHE_MB, at least 64 MB), least recently used out first, and
dropped when their trace is freed, so what was derived never outlives its trace (the words' merged attention of a
512-token SmolLM2 trace is as large as its weights). Results are read-only: never mutate what these return.

This module imports nothing else of ``ui``: ``ui.loaders`` and the pages' helpers all build on it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import threading
import weakref
from typing import Any, Callable, TypeVar

import numpy as np
import streamlit as st

from model_core.compact.trace import CompactTrace
from model_core.models.memory import BoundedCache, nbytes_of
from model_core.settings import load_settings
from model_core.trace.trace import AttentionTrace

R = TypeVar("R")
Trace = AttentionTrace | CompactTrace
DERIVED_TTL_S = 3600
DERIVED_MAX_ENTRIES = 512


def trace_key(trace: Trace) -> str:
    """A string that identifies a trace by its content. A full trace: its model description (weights, shape, causal
    flag, LayerNorm placement), causal flag, tokens, where sentence B starts, and head mask; a compact trace: its
    description and tokens (it has no head mask)."""
    reply = getattr(trace, "reply_start", None)  # a generated sequence's figures mark its reply
    if isinstance(trace, CompactTrace):
        return f"compact|{trace.description}|{trace.causal}|{'␟'.join(trace.tokens)}|{reply}"
    mask = "".join("1" if on else "0" for on in trace.head_mask.ravel())
    return f"{trace.description}|{trace.causal}|{'␟'.join(trace.tokens)}|{trace.sentence_b_start}|{mask}|{reply}"


def result_nbytes(value: Any, depth: int = 0) -> int:
    """The bytes a derived result holds: its arrays, bytes and strings, through tuples, lists, dicts and dataclasses."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, (bytes, str)):
        return len(value)
    if depth > 4:
        return 0
    if isinstance(value, dict):
        return sum(result_nbytes(v, depth + 1) for v in value.values())
    if isinstance(value, (tuple, list)):
        return sum(result_nbytes(v, depth + 1) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(result_nbytes(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value))
    return nbytes_of(value)


class DerivedCache(BoundedCache):
    """``BoundedCache`` keyed (trace key, function, arguments), whose entries of a trace can be dropped together."""

    def entries_of(self, trace: str) -> int:
        """How many results derived from the trace keyed ``trace`` are held."""
        with self._lock:
            return sum(1 for k in self._items if k[0] == trace)

    def drop(self, *, trace: str | None = None, function: str | None = None) -> None:
        """Drop every entry derived from the trace keyed ``trace`` (it was freed), or by ``function``."""
        def match(k: tuple) -> bool:
            return k[0] == trace or k[1] == function

        with self._lock:
            for old in [k for k in self._items if match(k)]:
                del self._items[old]
            for old in [k for k in list(self._gone.keys()) if match(k)]:
                self._gone.pop(old, None)


DERIVED_MIN_MB = 64
"""The least the derived results may hold, whatever AE_TRACE_CACHE_MB says: a page reads several (the heatmaps page
its statistics and its mosaic), and a budget of one entry would compute them again on every rerun."""


def derived_budget() -> float:
    """Bytes the derived results may hold together: half of AE_TRACE_CACHE_MB (at least ``DERIVED_MIN_MB``), beside
    the traces themselves."""
    return max(load_settings().trace_cache_mb / 2, DERIVED_MIN_MB) * 1e6


DERIVED = DerivedCache(lambda: derived_budget(), max_entries=DERIVED_MAX_ENTRIES, ttl_s=DERIVED_TTL_S,
                       size=result_nbytes)
"""Every per-trace derived result of the process: keys (trace key, function, arguments)."""

_KEYS: dict[int, str] = {}  # id(trace) -> trace_key, while the trace lives (its finalizer removes it)
_KEYS_LOCK = threading.Lock()
_FREED: collections.deque[tuple[int, str]] = collections.deque()  # (id, key) of freed traces, not yet forgotten
_DRAIN_LOCK = threading.Lock()  # taken before _KEYS_LOCK and the cache's own lock, never while holding either


def _forget(ident: int, key: str) -> None:
    """A trace's finalizer: note it and take no lock. A finalizer runs in whichever thread frees the trace (a
    garbage collection any allocation starts), which may hold ``_KEYS_LOCK`` or the cache's own lock at that moment;
    a thread of its own drops the results (it waits for those locks like any other thread), and so does the next
    ``cached_key``."""
    _FREED.append((ident, key))
    threading.Thread(target=_drain_freed, name="ae-forget-trace", daemon=True).start()


def _drain_freed() -> None:
    """Forget the traces freed since the last call, and drop their results unless a live trace has the same key.

    One drain at a time: a caller returns only once every trace freed before it came is forgotten, also where a
    freed trace's own thread had taken it from the queue and was still waiting for the locks.
    """
    with _DRAIN_LOCK:
        while True:
            try:
                ident, key = _FREED.popleft()
            except IndexError:
                return
            with _KEYS_LOCK:
                if _KEYS.get(ident) == key:
                    del _KEYS[ident]
                alive = key in _KEYS.values()  # another live trace object with the same content keeps its results
            if not alive:
                DERIVED.drop(trace=key)


def cached_key(trace: Trace) -> str:
    """``trace_key(trace)``, computed once per trace object; its derived results are dropped when it is freed."""
    _drain_freed()
    ident = id(trace)
    with _KEYS_LOCK:
        key = _KEYS.get(ident)
    if key is None:
        key = trace_key(trace)
        with _KEYS_LOCK:
            _KEYS[ident] = key
        weakref.finalize(trace, _forget, ident, key)
    return key


def stoppable() -> None:
    """Called while this run waits for another session's build of the same result: reading the session state is
    where Streamlit stops or restarts a run (a Cancel, a new text, a closed tab), so the wait can end. Outside a
    Streamlit run it does nothing."""
    with contextlib.suppress(Exception):
        _ = "_" in st.session_state


def per_trace(*, spinner: str | bool = False) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Decorate ``fn(trace, *args)`` (a full or a compact trace) so it runs once per (trace, args) and is shared from
    then on, in ``DERIVED``.

    ``args`` must be hashable (numbers, strings, tuples); ``spinner`` is shown while a result is computed (a function
    may draw its own progress bar instead: it runs in the calling script). The decorated function has
    ``cached(trace, *args)``: whether the result is there without computing it, and ``clear()``.
    """

    def decorate(fn: Callable[..., R]) -> Callable[..., R]:
        name = f"{fn.__module__}.{fn.__qualname__}"

        @functools.wraps(fn)
        def call(trace: Trace, *args: Any) -> R:
            def build() -> R:
                with st.spinner(spinner) if isinstance(spinner, str) else contextlib.nullcontext():
                    return fn(trace, *args)

            return DERIVED.get((cached_key(trace), name, args), build, wait=stoppable)

        def cached(trace: Trace, *args: Any) -> bool:
            return (cached_key(trace), name, args) in DERIVED

        def clear() -> None:
            DERIVED.drop(function=name)

        call.cached = cached  # type: ignore[attr-defined]
        call.clear = clear  # type: ignore[attr-defined]
        return call

    return decorate
