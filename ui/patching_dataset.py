"""Activation patching over a dataset in the app: the pairs' widgets (``ui.dataset_fields``: a generator with its
count and seed, or an uploaded JSONL or CSV), the check of every pair, mean patching with a progress bar and a Stop
(``ui.kept_run``), and the result.

Mean patching runs one pair after another, each through the single-pair pipeline, so it takes about as long as
exact patching once a pair: it runs when asked (the Run button). The result (or, after a Stop, the pairs finished) is
kept in the session that ran it.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from attention_explorer.figures import token_labels
from attention_explorer.patching import (
    effect_range,
    mean_effect_figure,
    residual_figure,
)
from model_core import TraceRequest
from model_core.circuits.budget import mean_patching_seconds
from model_core.circuits.datasets import Dataset, Validated
from model_core.circuits.mean_patching import MeanPatching, mean_patching
from model_core.effects.patching_run import check_patching_memory
from model_core.io.tables import grid_to_csv, matrix_to_csv
from ui.analysis_widgets import csv_button, how_to_read, show_figure
from ui.circuits import duration
from ui.dataset_fields import (
    checked_pairs,
    pair_counts,
    pair_source,
    run_when_asked,
    show_problems,
)
from ui.kept_run import KeptRun

MODE_KEY = "patch_mode"
"""The page's mode: "pair" (one clean/corrupted pair, as before) or "dataset"."""
DATASET_PREFIX = "patch_ds_"
"""The dataset widgets' keys (``ui.dataset_fields.pair_source``): patch_ds_source, patch_ds_generator, patch_ds_count,
patch_ds_seed, patch_ds_upload."""
RUN_KEY, STOP_BUTTON_KEY = "patch_ds_run", "patch_ds_stop"
RESULT_KEY = "_patch_ds_result"
"""Session state: (run key, MeanPatching) of this session's latest run, partial while it runs or when stopped."""
STOPPED_KEY = "_patch_ds_stopped"
ETA_KEY = "_patch_ds_eta"
"""Session state: (run key, (seconds of the calibration pass, seconds of the run)) of the latest time estimate."""
KEPT = KeptRun(RESULT_KEY, STOPPED_KEY, STOP_BUTTON_KEY)
DEFAULT_COUNT = 8


def run_mean(key: tuple, resolved: Any, dataset: Dataset) -> MeanPatching:
    """Mean patching with a progress bar and a Stop button. Each finished pair is kept in the session as it goes, so
    a Stop (any click reruns the page and ends this run at its next progress message) keeps the pairs done."""
    with KEPT.running("Mean patching: starting…", "Keeps the pairs finished; the one under way is dropped.") as bar:

        def progress(done: float, total: int) -> None:
            bar.progress(min(done / total, 1.0), text=f"Mean patching: pair {min(int(done) + 1, total)} of {total}")

        result = mean_patching(resolved, dataset, progress=progress, keep=lambda done: KEPT.keep(key, done))
        KEPT.keep(key, result)
    return result


def before_run(key: tuple, resolved: Any, checked: Validated) -> bool:
    """Before a run: False, with the refusal shown (the estimate and the limit), when not even the shortest pair fits
    ``AE_RUN_MEMORY_MB``; else True, with how long the run will take (one timed pass, once per run key)."""
    try:
        check_patching_memory(resolved, min(p.n_tokens for p in checked.pairs), attribution=False)
    except ValueError as exc:  # RunMemoryError
        st.error(str(exc), icon=":material/memory:")
        return False
    kept = st.session_state.get(ETA_KEY)
    if kept is None or kept[0] != key:
        kept = (key, mean_patching_seconds(resolved, checked.pairs))
        st.session_state[ETA_KEY] = kept
    first, total = kept[1]
    st.caption(f"The run will take {duration(total)} on this server now: one pass of the first pair's patched copies "
               f"took {first:.2f} s, and each pair makes its two runs and a patched copy a head and a residual "
               "position.")
    return True


def explain() -> None:
    how_to_read(
        "A dataset of prompt pairs, each a clean and a corrupted prompt of the same token count with its answer and "
        "foil. Every pair is patched exactly as on the single pair (each head's output z, and the residual stream "
        "entering each layer at each position, taken from the clean run into the corrupted one), and its effects are "
        "normalised by its own (m_clean − m_corrupt). The grid shows each head's **mean effect** over the pairs; "
        "hover a cell for its **spread**, the standard deviation over the pairs. The residual stream is averaged per "
        "(layer, position) only where every pair has the same token count (one template), so the positions line "
        "up. A pair whose prompts differ in length, or whose answer or foil is not one token, is listed with its "
        "pieces and left out; the others run.",
        "Wang et al. (2022), Interpretability in the Wild (IOI); Hanna et al. (2023), How does GPT-2 compute "
        "greater-than?; Heimersheim & Nanda (2024), How to use and interpret activation patching.",
    )


def show_result(result: MeanPatching, tokens_note: str) -> None:
    """The metrics, the mean-effect grid with spread on hover, the residual grid (or why it is left out), the
    problems and the downloads."""
    m1, m2, m3 = st.columns(3)
    m1.metric("Pairs run", f"{result.n} of {result.to_run}" if result.partial else result.n)
    m2.metric("Mean clean metric", "n/a" if not result.n else f"{result.clean:+.3f}",
              help="logit(answer) − logit(foil) after each clean prompt, averaged")
    m3.metric("Mean corrupted metric", "n/a" if not result.n else f"{result.corrupt:+.3f}")
    if result.partial:
        st.warning(f"Mean patching was stopped{' by you' if st.session_state.get(STOPPED_KEY) else ''}: "
                   f"{result.n} of {result.to_run} pairs are averaged. Run it again to patch every pair.",
                   icon=":material/pause_circle:")
    if result.n:
        show_figure(mean_effect_figure(result.heads, result.heads_std,
                                       f"Mean effect over {result.n} pairs (hover: spread)",
                                       scale=effect_range(result.heads)), "patching_mean_heads",
                    key="patch_ds_heads")
        if result.residual is not None:
            show_figure(residual_figure(result.residual, result.tokens, "Mean patching of resid_pre",
                                        scale=effect_range(result.residual)), "patching_mean_residual",
                        key="patch_ds_resid")
            st.caption(tokens_note)
    if result.residual is None and result.residual_note:
        st.info(result.residual_note, icon=":material/info:")
    show_problems(result.problems, "did not run")
    if result.n:
        d1, d2, d3 = st.columns(3)
        with d1:
            csv_button("Mean effect per head (CSV)", grid_to_csv(result.heads), "patching_mean_heads.csv",
                       "patch_ds_csv_h")
        with d2:
            csv_button("Spread per head (CSV)", grid_to_csv(result.heads_std), "patching_mean_heads_std.csv",
                       "patch_ds_csv_s")
        with d3:
            if result.residual is not None:
                residual = result.residual
                csv_button("Mean residual grid (CSV)", lambda: matrix_to_csv(
                    residual, [f"layer {i}" for i in range(residual.shape[0])], token_labels(result.tokens)),
                    "patching_mean_residual.csv", "patch_ds_csv_r")


def resolved_model(model: TraceRequest) -> Any:
    """The page's decoder, resolved through the app's model cache."""
    from model_core.trace.resolve import resolve
    from ui.loaders import CACHED_MODELS, device

    return resolve(model, device=device(), models=CACHED_MODELS)


def dataset_mode(model: TraceRequest) -> None:
    """The whole dataset mode of the patching page on the decoder ``model`` names (its request without text)."""
    resolved = resolved_model(model)
    explain()
    picked = pair_source(DATASET_PREFIX, DEFAULT_COUNT)
    if picked is None:
        return
    source_key, dataset = picked
    checked = checked_pairs(dataset, resolved.tokenizer)
    if checked is None:
        return
    shared = checked.n_tokens
    st.caption(pair_counts(dataset, checked)
               + (f"{shared} tokens each (one template)." if shared is not None else
                  "of different token counts, so the residual stream is left out."))
    key = (model, source_key)
    if KEPT.finished(key) is None and not before_run(key, resolved, checked):
        return
    result = run_when_asked(
        KEPT.finished(key), checked, f"Run mean patching ({len(checked.pairs)} pairs)", RUN_KEY,
        "Exact patching of every pair, one after another; a Stop keeps the pairs finished.",
        lambda: run_mean(key, resolved, dataset))
    if result is None:
        return
    show_result(result, "Columns: the positions, labelled with the first pair's clean tokens.")
    if result.n == 0 and not result.partial:
        st.error("No pair ran: every valid pair's clean and corrupted metrics were equal (listed above).",
                 icon=":material/error:")
