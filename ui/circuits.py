"""The Circuits page's plumbing: the keys of the dataset's widgets (``ui.dataset_fields``: a generator with its count
and seed, or an uploaded JSONL or CSV), the method and steps, the run with a progress bar and a Stop, and the result
kept in the session (``ui.kept_run``).

Edge attribution runs when asked (the Run button). Every finished batch is kept in the session as it goes: a Stop
(any click reruns the page, and Streamlit ends this run at its next progress message) keeps the batches done, marked
partial. The figures come from ``attention_explorer.circuits`` (the notebook draws the same ones).
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from attention_explorer.circuits import node_totals
from model_core import TraceRequest
from model_core.circuits.budget import (
    FittedBatches,
    fitted_batches,
    pass_seconds,
    passes_a_batch,
    run_seconds,
)
from model_core.circuits.datasets import Dataset, Validated
from model_core.circuits.eap import CircuitModel, circuit_model, default_batch
from model_core.circuits.result import CircuitResult
from model_core.circuits.run import run_circuit
from model_core.models.run_memory import RunMemoryError, device_of, run_memory_limit_mb
from ui.kept_run import KeptRun
from ui.roles import heatmaps_url

DATASET_PREFIX = "circ_"
"""The dataset widgets' keys (``ui.dataset_fields.pair_source``): circ_source, circ_generator, circ_count, circ_seed,
circ_upload."""
METHOD_KEY, STEPS_KEY = "circ_method", "circ_steps"
RUN_KEY, STOP_BUTTON_KEY, FRACTION_KEY = "circ_run", "circ_stop", "circ_fraction"
RESULT_KEY = "_circ_result"
"""Session state: (run key, CircuitResult) of this session's latest run, partial while it runs or when stopped."""
STOPPED_KEY = "_circ_stopped"
ETA_KEY = "_circ_eta"
"""Session state: (run key, seconds of the calibration pass) of the latest time estimate."""
KEPT = KeptRun(RESULT_KEY, STOPPED_KEY, STOP_BUTTON_KEY)
DEFAULT_COUNT = 16


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


def circuit_model_of(model: TraceRequest) -> CircuitModel:
    """The page's decoder from the app's model cache, ready for edge attribution (never changed: only read)."""
    from ui.loaders import pretrained_for

    loaded = pretrained_for(model)
    return circuit_model(loaded.model, loaded.tokenizer)


def run(key: tuple, cm: CircuitModel, dataset: Dataset, method: str, steps: int) -> CircuitResult:
    """Edge attribution and the faithfulness curve with a progress bar and a Stop button; each finished batch is kept
    in the session as it goes (``ui.kept_run``)."""
    with KEPT.running("Edge attribution: starting…",
                      "Keeps the batches of pairs finished; the circuit is drawn from them.") as bar:

        def progress(share: float, text: str) -> None:
            bar.progress(min(max(share, 0.0), 1.0), text=text)

        result = run_circuit(cm, dataset, method=method, steps=steps, progress=progress,
                             keep=lambda done: KEPT.keep(key, done))
        KEPT.keep(key, result)
    return result


def fitted_or_refused(cm: CircuitModel, checked: Validated) -> FittedBatches | None:
    """The run's batches within ``AE_RUN_MEMORY_MB`` (long pairs fewer to a batch); None, with the refusal shown
    (the estimate and the limit), when not one pair fits."""
    try:
        return fitted_batches(cm, checked.pairs, default_batch(cm.model),
                              limit_mb=run_memory_limit_mb(device=device_of(cm.model)), curve=True)
    except RunMemoryError as exc:
        st.error(str(exc), icon=":material/memory:")
        return None


def duration(seconds: float) -> str:
    """About how long, in words: "about 40 s", "about 3 min", "about 1.5 h"."""
    if seconds < 90:
        return f"about {max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"about {round(seconds / 60)} min"
    return f"about {seconds / 3600:.1f} h"


def time_estimate(key: tuple, cm: CircuitModel, fitted: FittedBatches, steps: int) -> str:
    """How long the run will take here: one forward pass of its first batch is timed (once per run key, in the gate's
    turn) and scaled by the run's tokens and passes (``circuits.budget.run_seconds``)."""
    kept = st.session_state.get(ETA_KEY)
    if kept is None or kept[0] != key:
        kept = (key, pass_seconds(cm, fitted.batches[0]))
        st.session_state[ETA_KEY] = kept
    first = kept[1]
    total = run_seconds(fitted.batches, first, steps, curve=True)
    return (f"The run will take {duration(total)} on this server now: one pass of the first batch took "
            f"{first:.2f} s, and each batch makes about {passes_a_batch(steps, True):.0f} such passes "
            f"({len(fitted.batches)} batch{'es' if len(fitted.batches) != 1 else ''}).")


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
