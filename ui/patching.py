"""Activation patching in the app: the prompt pair's widgets, the two runs and attribution patching cached per (model,
prompts) for every session, exact patching with a progress bar and a Stop button, and the table's parts per trace.

Exact patching takes seconds to minutes, so it runs when asked (the Run button), never on opening the page; a
finished result is kept for every session (``EXACT``), a stopped one in the session that stopped it, marked partial.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from typing import Any

import streamlit as st

from model_core import AttentionTrace, TraceRequest
from model_core.effects.pairs import READY_PAIRS, PromptPair
from model_core.effects.patching import ExactPatching, PatchRuns
from model_core.effects.patching_attribution import AttributionPatching
from model_core.effects.patching_run import (
    PatchingPipeline,
    TableParts,
    check_patching_memory,
)
from model_core.effects.patching_run import table_parts as core_table_parts
from model_core.models.memory import BoundedCache
from model_core.settings import load_settings
from ui.fields import PAGE_PARAMS
from ui.trace_cache import per_trace

CLEAN_KEY, CORRUPT_KEY = PAGE_PARAMS["clean"][0], PAGE_PARAMS["corrupt"][0]
ANSWER_KEY, FOIL_KEY = PAGE_PARAMS["patch_answer"][0], PAGE_PARAMS["patch_foil"][0]
PAIR_KEY = "patch_pair"
PARTIAL_KEY = "_patch_partial"
"""Session state: (key, ExactPatching) of the run this session stopped or left, marked partial."""
STOPPED_KEY = "_patch_stopped"
PATCH_TTL_S = 3600
EXACT_KEPT = 16

PatchKey = tuple[TraceRequest, str, str, str, str]
"""(the model's request, clean, corrupt, answer, foil): what names a patching run."""


def model_request(request: TraceRequest) -> TraceRequest:
    """The request with its text and head mask dropped: what names the model patching runs."""
    return dataclasses.replace(request, text_a="", text_b="", truncate=False, head_mask=None)


def clean_request(model: TraceRequest, clean: str) -> TraceRequest:
    """The request of the clean prompt's trace (the table's attention; the heatmaps a head link opens)."""
    return dataclasses.replace(model, text_a=clean, text_b="")


def _fill(pair: PromptPair) -> None:
    s = st.session_state
    s[CLEAN_KEY], s[CORRUPT_KEY], s[ANSWER_KEY], s[FOIL_KEY] = pair.clean, pair.corrupt, pair.answer, pair.foil


def _on_pair() -> None:
    _fill(READY_PAIRS[int(st.session_state[PAIR_KEY])])


def pair_fields() -> tuple[str, str, str, str]:
    """The ready-pair selector and the four boxes (their keys are the link's ``pg_*``); an empty box takes the
    selected ready pair's text, shown as its placeholder. Returns (clean, corrupt, answer, foil) as used."""
    s = st.session_state
    choice = st.selectbox("Ready pair", range(len(READY_PAIRS)), key=PAIR_KEY, on_change=_on_pair,
                          format_func=lambda i: READY_PAIRS[i].title,
                          help="Written by the team: same number of tokens in both prompts, and the answer and foil "
                               "one token each, for SmolLM2 and GPT-2. Choosing one fills the boxes; edit them to "
                               "patch your own prompts.")
    pair = READY_PAIRS[int(choice)]
    st.caption(pair.note)
    left, right = st.columns(2)
    left.text_input("Clean prompt", key=CLEAN_KEY, placeholder=pair.clean)
    right.text_input("Corrupted prompt (as many tokens)", key=CORRUPT_KEY, placeholder=pair.corrupt)
    left.text_input("Answer (one token, leading space included)", key=ANSWER_KEY, placeholder=repr(pair.answer))
    right.text_input("Foil (one token)", key=FOIL_KEY, placeholder=repr(pair.foil))
    # A text box strips nothing, so " Paris" keeps its space.
    return (s.get(CLEAN_KEY) or pair.clean, s.get(CORRUPT_KEY) or pair.corrupt, s.get(ANSWER_KEY) or pair.answer,
            s.get(FOIL_KEY) or pair.foil)


def _resolved(model: TraceRequest) -> Any:
    from model_core.trace.resolve import resolve
    from ui.loaders import CACHED_MODELS, device

    return resolve(model, device=device(), models=CACHED_MODELS)


_BASES: BoundedCache = BoundedCache(lambda: load_settings().trace_cache_mb * 1e6 / 4, max_entries=16,
                                    ttl_s=PATCH_TTL_S)
"""``patch_base``'s results, shared by every session. Not a ``st.cache_resource``: the pass waits its turn at the gate
with the "Leave the queue" button (``ui.waiting.in_turn``), and a widget drawn inside a Streamlit cache is refused
(``CachedWidgetWarning``)."""


def patch_base(model: TraceRequest, clean: str, corrupt: str, answer: str,
               foil: str) -> tuple[PatchRuns, AttributionPatching]:
    """The inputs checked, then both runs and attribution patching (``PatchingPipeline.runs``: the clean run read from
    the clean prompt's trace, which the table and the heatmaps share, and one forward and one backward pass of the
    corrupted prompt), once per (model, prompts) for every session.

    Raises:
        PatchingError, NotADecoder, NotOneToken, InputError: the message says what to change (nothing is cached).
    """
    from ui.loaders import get_trace, pretrained_key
    from ui.trace_cache import stoppable
    from ui.waiting import in_turn

    def build() -> tuple[PatchRuns, AttributionPatching]:
        pipeline = PatchingPipeline.prepare(_resolved(model), clean, corrupt, answer, foil)  # the checks, at once
        inputs = pipeline.inputs
        check_patching_memory(pipeline.resolved, inputs.n_tokens)  # before the clean prompt's trace, not after it
        trace = get_trace(clean_request(model, clean))  # before the turn: it may wait for another session's build
        _table_beside(trace, pretrained_key(model), inputs.answer_id, inputs.foil_id)
        return in_turn(f"patch|{model!r}|{clean}|{corrupt}", lambda: pipeline.runs(trace))

    return _BASES.get((model, clean, corrupt, answer, foil), build, wait=stoppable)


def _table_beside(trace: AttentionTrace, key: tuple[str, str], answer_id: int, foil_id: int) -> None:
    """Start ``table_parts`` (the table's DLA and role scores, which read only the clean trace) in a thread of its own,
    beside the passes: torch's kernels let go of the GIL, and with one torch thread the server keeps a core free. The
    page's own call later takes the result from ``DERIVED`` (or waits for it); an error there is the page's to show,
    so one here is dropped. bench/bench_patching.py, the page from a link against the heatmaps page: 1.48-1.59x
    before, 1.36-1.48x with it."""
    from streamlit.runtime.scriptrunner import add_script_run_ctx, get_script_run_ctx

    def build() -> None:
        try:
            table_parts(trace, *key, answer_id, foil_id)
        except Exception:  # noqa: BLE001, S110 - the page calls it again and shows the error
            pass

    thread = threading.Thread(target=build, name="patching-table", daemon=True)
    add_script_run_ctx(thread, get_script_run_ctx(suppress_warning=True))
    thread.start()


_EXACT: OrderedDict[PatchKey, ExactPatching] = OrderedDict()
_EXACT_LOCK = threading.Lock()


def finished_exact(key: PatchKey) -> ExactPatching | None:
    """A finished exact patching of ``key`` (any session's), or this session's stopped one, or None."""
    with _EXACT_LOCK:
        found = _EXACT.get(key)
        if found is not None:
            _EXACT.move_to_end(key)
            return found
    kept = st.session_state.get(PARTIAL_KEY)
    return kept[1] if kept is not None and kept[0] == key else None


def _keep(key: PatchKey, result: ExactPatching) -> None:
    if result.partial:
        st.session_state[PARTIAL_KEY] = (key, result)
        return
    with _EXACT_LOCK:
        _EXACT[key] = result
        while len(_EXACT) > EXACT_KEPT:
            _EXACT.popitem(last=False)
    st.session_state.pop(PARTIAL_KEY, None)


def _stop() -> None:
    st.session_state[STOPPED_KEY] = True


def stopped_exact(key: PatchKey) -> ExactPatching | None:
    """This session's partial exact patching of ``key`` (stopped, or cut short by another click), or None."""
    kept = st.session_state.get(PARTIAL_KEY)
    return kept[1] if kept is not None and kept[0] == key and kept[1].partial else None


def run_exact(key: PatchKey) -> ExactPatching:
    """Exact patching of ``key`` with a progress bar and a Stop button, resuming this session's partial run of it.
    What each batch computes is kept in the session as it goes: a Stop (or any other click, which reruns the page)
    ends the run and the next run of the page shows the partial grid; running it again patches only the rest."""
    runs = patch_base(*key)[0]
    pipeline = PatchingPipeline(_resolved(key[0]), runs.inputs)
    st.session_state[STOPPED_KEY] = False
    bar = st.progress(0.0, text="Exact patching: starting…")
    stop_slot = st.empty()
    stop_slot.button("Stop", key="patch_stop_button", on_click=_stop, icon=":material/stop:",
                     help="Keeps the effects computed so far; the grid is marked partial.")

    def progress(done: int, total: int) -> None:
        bar.progress(done / total, text=f"Exact patching: {done} of {total} patched passes")

    # No ``stop`` flag: the Stop button's callback runs only at the start of the next script run, so a flag it set
    # could never be read as True during this one. Stopping works because the click asks Streamlit for a rerun, and
    # the script runner ends this run (a RerunException) at its next message to the browser, the next bar.progress;
    # ``keep`` has stored every finished batch by then, and the callback marks the partial result as stopped by you.
    result = pipeline.exact(runs, progress=progress, keep=lambda r: _keep(key, r), resume=stopped_exact(key))
    _keep(key, result)
    bar.empty()
    stop_slot.empty()
    return result


def softcap_note(model: Any) -> str | None:
    """A caption for a model whose logits are softcapped (Gemma 2): the metric is after the cap, the DLA column
    before it. None for other models."""
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap is None:
        return None
    return (f"This model caps its logits (c·tanh(x/c), c = {cap:g}). The metric and every patching effect are after "
            "the cap, as the model predicts; the table's **dla** column is before it (the cap is not linear, so "
            "direct logit attribution splits the logit under it), so the two are on different scales.")


@per_trace()
def table_parts(trace: AttentionTrace, model_id: str, device_name: str, answer_id: int, foil_id: int) -> TableParts:
    """The table's columns that read the clean prompt's trace and the model (the core's ``table_parts``: each head's
    direct logit attribution, or None, and its text role scores), once per (trace, answer, foil)."""
    from ui.loaders import get_pretrained

    loaded = get_pretrained(model_id, device_name)
    return core_table_parts(trace, loaded.model, loaded.family, answer_id, foil_id)
