"""The KV cache page's cached results: the prefilled cache and each policy's key order once per trace, a budget
once per (trace, policy, ratio), the sweep once per trace, the needle test once per model.

Scores read the page's own trace (full, or compact for a long text: ``model_core.generate.kv_sources``); the cache
comes from one prefill pass of the cached model the trace came from (``ui.loaders.get_pretrained``).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import streamlit as st

from model_core.generate.kv import RATIOS, KVPlan, KVResult, Prefill, compress, prefill
from model_core.generate.kv_batch import KVSweep, sweep
from model_core.generate.kv_sources import source_of
from model_core.generate.needle import NeedleResult, needle_test
from model_core.generate.presses import PRESS_TITLES, PRESSES, key_order, press_scores
from ui.loaders import get_pretrained
from ui.trace_cache import per_trace


@per_trace(spinner="Prefilling the KV cache (every token but the last)…")
def cached_prefill(trace: Any, model_id: str, device_name: str) -> Prefill:
    """The prefilled cache of the trace's text and the last token's full-cache run (``kv.prefill``)."""
    loaded = get_pretrained(model_id, device_name)
    return prefill(loaded.family, loaded.model, np.asarray(trace.token_ids))[0]  # the pass's queries go


@per_trace(spinner="Scoring the keys…")
def cached_order(trace: Any, press: str) -> np.ndarray:
    """The policy's key order from the trace's attention (``presses.key_order``). Shape: (layer, kv_head, n_prefill)."""
    order = key_order(press_scores(source_of(trace), press))
    order.setflags(write=False)
    return order


def plan_of(trace: Any, model_id: str, device_name: str, presses: tuple[str, ...]) -> KVPlan:
    """A plan of the cached prefill and the cached orders of ``presses``."""
    return KVPlan(cached_prefill(trace, model_id, device_name), {p: cached_order(trace, p) for p in presses})


@per_trace(spinner="Running the last token on the compressed cache…")
def cached_result(trace: Any, model_id: str, device_name: str, press: str, ratio: float) -> KVResult:
    """``kv.compress`` of the trace's text with ``press`` at ``ratio``."""
    loaded = get_pretrained(model_id, device_name)
    plan = plan_of(trace, model_id, device_name, (press,))
    return compress(plan, loaded.family, loaded.model, press, ratio, loaded.tokenizer)


@per_trace()
def cached_sweep(trace: Any, model_id: str, device_name: str) -> KVSweep:
    """Every policy at every ratio (``kv_batch.sweep``), with a progress bar: the prefill and each policy's scores
    once, then one batched single-token pass per policy."""
    bar = st.progress(0.0, text="Budget sweep: prefilling…")
    loaded = get_pretrained(model_id, device_name)
    orders = {}
    cached_prefill(trace, model_id, device_name)
    for i, press in enumerate(PRESSES):
        bar.progress(0.2 * i / len(PRESSES), text=f"Budget sweep: scoring with {PRESS_TITLES[press]}…")
        orders[press] = cached_order(trace, press)
    plan = KVPlan(cached_prefill(trace, model_id, device_name), orders)

    def step(done: int, total: int) -> None:
        bar.progress(0.2 + 0.8 * done / total, text=f"Budget sweep: {done} of {total} policies' 9 budgets run")

    result = sweep(plan, loaded.family, loaded.model, PRESSES, RATIOS, progress=step)
    bar.empty()
    return result


_NEEDLES: dict[tuple[str, str], NeedleResult] = {}
_NEEDLES_LOCK = threading.Lock()


def needle_done(model_id: str, device_name: str) -> NeedleResult | None:
    """The needle test of a model, if it has run in this process."""
    with _NEEDLES_LOCK:
        return _NEEDLES.get((model_id, device_name))


def run_needle(model_id: str, device_name: str) -> NeedleResult:
    """The needle test of a model (``model_core.generate.needle``), with a progress bar; once per process."""
    found = needle_done(model_id, device_name)
    if found is not None:
        return found
    loaded = get_pretrained(model_id, device_name)
    bar = st.progress(0.0, text="Needle test: prefilling the text…")

    def step(done: int, total: int) -> None:
        bar.progress(done / total, text=f"Needle test: {done} of {total} decoded (the full cache, then each policy's 9 budgets)")

    result = needle_test(loaded.family, loaded.model, loaded.tokenizer, PRESSES, RATIOS, progress=step)
    bar.empty()
    with _NEEDLES_LOCK:
        _NEEDLES[(model_id, device_name)] = result
    return result


def kept_rows(result: KVResult) -> list[dict[str, Any]]:
    """One row per kept key, for a CSV: layer, key/value head, position."""
    n_layers, n_kv, _ = result.kept.shape
    return [{"layer": la, "kv_head": g, "position": int(p)} for la in range(n_layers) for g in range(n_kv)
            for p in result.kept[la, g]]
