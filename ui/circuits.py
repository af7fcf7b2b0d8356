"""The Circuits page's plumbing: the dataset's widgets (a generator with its count and seed, or an uploaded JSONL or
CSV), the method and steps, the run with a progress bar and a Stop, and the result kept in the session.

Edge attribution runs when asked (the Run button). Every finished batch is kept in the session as it goes: a Stop
(any click reruns the page, and Streamlit ends this run at its next progress message) keeps the batches done, marked
partial. The figures come from ``attention_explorer.circuits`` (the notebook draws the same ones).
"""

from __future__ import annotations

import hashlib
from typing import Any

import streamlit as st

from attention_explorer.circuits import node_totals
from model_core import TraceRequest
from model_core.circuits.datasets import Dataset, DatasetError, from_generator, parse_pairs
from model_core.circuits.eap import CircuitModel, circuit_model
from model_core.circuits.generators import GENERATORS
from model_core.circuits.result import CircuitResult
from model_core.circuits.run import run_circuit
from ui.roles import heatmaps_url

SOURCE_KEY, GENERATOR_KEY = "circ_source", "circ_generator"
COUNT_KEY, SEED_KEY, UPLOAD_KEY = "circ_count", "circ_seed", "circ_upload"
METHOD_KEY, STEPS_KEY = "circ_method", "circ_steps"
RUN_KEY, STOP_BUTTON_KEY, FRACTION_KEY = "circ_run", "circ_stop", "circ_fraction"
RESULT_KEY = "_circ_result"
"""Session state: (run key, CircuitResult) of this session's latest run, partial while it runs or when stopped."""
STOPPED_KEY = "_circ_stopped"
DEFAULT_COUNT, MAX_COUNT = 16, 256
GENERATOR_TITLES = {"ioi": "Names (IOI)", "greater-than": "Greater-than (years)", "induction": "Induction (words)",
                    "facts": "Factual recall"}


def dataset_fields() -> tuple[tuple, Dataset] | None:
    """The source of the pairs: a generator (count, seed) or an upload. Returns (a key naming the pairs, the
    dataset), or None (nothing uploaded yet, or a file that cannot be read: the message is shown)."""
    source = st.radio("Pairs from", ["generator", "upload"], horizontal=True, key=SOURCE_KEY,
                      format_func={"generator": "A generator", "upload": "My file (JSONL or CSV)"}.get)
    if source == "generator":
        left, mid, right = st.columns([2, 1, 1])
        name = left.selectbox("Generator", list(GENERATORS), key=GENERATOR_KEY, format_func=GENERATOR_TITLES.get,
                              help="Written by the team; the same pairs for the same seed.")
        count = mid.number_input("Pairs", 1, MAX_COUNT, DEFAULT_COUNT, key=COUNT_KEY)
        seed = right.number_input("Seed", 0, 2**31 - 1, 0, key=SEED_KEY)
        spec = f"{name}:{int(count)}:{int(seed)}"
        try:
            return ("generator", spec), from_generator(spec)
        except DatasetError as exc:
            st.error(str(exc), icon=":material/error:")
            return None
    upload = st.file_uploader("Pairs: JSONL (one object a line) or CSV, with clean, corrupt, answer, foil",
                              key=UPLOAD_KEY)
    if upload is None:
        st.info('Upload a file of pairs: JSONL lines such as {"clean": "...", "corrupt": "...", "answer": " Mary", '
                '"foil": " John"}, or a CSV whose header is clean,corrupt,answer,foil.', icon=":material/upload:")
        return None
    data = upload.getvalue()
    try:
        dataset = parse_pairs(data, upload.name)
    except DatasetError as exc:
        st.error(str(exc), icon=":material/error:")
        return None
    return ("upload", upload.name, hashlib.sha256(data).hexdigest()), dataset


def method_fields() -> tuple[str, int]:
    """The method (EAP or EAP-IG) and EAP-IG's steps."""
    left, right = st.columns([2, 1])
    method = left.radio("Method", ["eap-ig", "eap"], horizontal=True, key=METHOD_KEY,
                        format_func={"eap-ig": "EAP-IG (integrated gradients)", "eap": "EAP (one gradient)"}.get,
                        help="EAP takes the gradient on the clean run; EAP-IG averages it over the steps from the "
                             "corrupted to the clean input, and finds more faithful circuits.")
    steps = right.number_input("Steps", 1, 50, 5, key=STEPS_KEY, disabled=method == "eap",
                               help="EAP-IG's points along the path (EAP uses 1).")
    return method, 1 if method == "eap" else int(steps)


def show_problems(problems: list[str] | tuple[str, ...], ran: str) -> None:
    """Every pair that does not run, one line each, under a warning that says how many."""
    if problems:
        st.warning(f"{len(problems)} pair{'s' if len(problems) != 1 else ''} {ran}; the others run. Each line "
                   "names the pair's row and what to change.", icon=":material/warning:")
        st.code("\n".join(problems), language=None, wrap_lines=True)


def circuit_model_of(model: TraceRequest) -> CircuitModel:
    """The page's decoder from the app's model cache, ready for edge attribution (never changed: only read)."""
    from ui.loaders import pretrained_for

    loaded = pretrained_for(model)
    return circuit_model(loaded.model, loaded.tokenizer)


def _stop() -> None:
    st.session_state[STOPPED_KEY] = True


def finished(key: tuple) -> CircuitResult | None:
    """This session's result for ``key`` (partial when stopped), or None."""
    kept = st.session_state.get(RESULT_KEY)
    return kept[1] if kept is not None and kept[0] == key else None


def run(key: tuple, cm: CircuitModel, dataset: Dataset, method: str, steps: int) -> CircuitResult:
    """Edge attribution and the faithfulness curve with a progress bar and a Stop button; each finished batch is kept
    in the session as it goes."""
    st.session_state[STOPPED_KEY] = False
    bar = st.progress(0.0, text="Edge attribution: starting…")
    stop_slot = st.empty()
    stop_slot.button("Stop", key=STOP_BUTTON_KEY, on_click=_stop, icon=":material/stop:",
                     help="Keeps the batches of pairs finished; the circuit is drawn from them.")

    def progress(share: float, text: str) -> None:
        bar.progress(min(max(share, 0.0), 1.0), text=text)

    def keep(result: CircuitResult) -> None:
        st.session_state[RESULT_KEY] = (key, result)

    # No stop flag: the Stop button's callback runs only at the start of the next script run (see ui.patching).
    result = run_circuit(cm, dataset, method=method, steps=steps, progress=progress, keep=keep)
    keep(result)
    bar.empty()
    stop_slot.empty()
    return result


def head_rows(result: CircuitResult, keep: Any, request: TraceRequest, text: str) -> list[dict[str, Any]]:
    """Per node of the circuit, the sum of its edges' |scores|, largest first; each head with a link that opens its
    heatmap on ``text`` (the first clean prompt)."""
    rows = []
    for name, total in node_totals(result.scores, keep):
        link = None
        if name.startswith("a"):
            layer, head = (int(x) for x in name[1:].split(".h"))
            link = heatmaps_url(request, text, layer, head)
        rows.append({"node": name, "sum_abs_score": total, "open": link})
    return rows
