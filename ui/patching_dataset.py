"""Activation patching over a dataset in the app: the pairs' widgets (a generator with its count and seed, or an
uploaded JSONL or CSV), the check of every pair, mean patching with a progress bar and a Stop, and the result.

Mean patching runs one pair after another, each through the single-pair pipeline, so it takes about as long as
exact patching once a pair: it runs when asked (the Run button). The result (or, after a Stop, the pairs finished) is
kept in the session that ran it.
"""

from __future__ import annotations

import hashlib
from typing import Any

import streamlit as st

from attention_explorer.figures import token_labels
from attention_explorer.patching import (
    effect_range,
    mean_effect_figure,
    residual_figure,
)
from model_core import TraceRequest
from model_core.circuits.datasets import (
    Dataset,
    DatasetError,
    Validated,
    from_generator,
    parse_pairs,
    validate,
)
from model_core.circuits.generators import GENERATORS
from model_core.circuits.mean_patching import MeanPatching, mean_patching
from model_core.io.tables import grid_to_csv, matrix_to_csv
from ui.analysis_widgets import csv_button, how_to_read, show_figure

MODE_KEY = "patch_mode"
"""The page's mode: "pair" (one clean/corrupted pair, as before) or "dataset"."""
SOURCE_KEY, GENERATOR_KEY = "patch_ds_source", "patch_ds_generator"
COUNT_KEY, SEED_KEY, UPLOAD_KEY = "patch_ds_count", "patch_ds_seed", "patch_ds_upload"
RUN_KEY, STOP_BUTTON_KEY = "patch_ds_run", "patch_ds_stop"
RESULT_KEY = "_patch_ds_result"
"""Session state: (run key, MeanPatching) of this session's latest run, partial while it runs or when stopped."""
STOPPED_KEY = "_patch_ds_stopped"
DEFAULT_COUNT, MAX_COUNT = 8, 256
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
        return ("generator", spec), from_generator(spec)
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


def show_problems(problems: list[str] | tuple[str, ...], ran: str) -> None:
    """Every pair that does not run, one line each, under a warning that says how many."""
    if problems:
        st.warning(f"{len(problems)} pair{'s' if len(problems) != 1 else ''} {ran}; the others run. Each line "
                   "names the pair's row and what to change.", icon=":material/warning:")
        st.code("\n".join(problems), language=None, wrap_lines=True)


def _stop() -> None:
    st.session_state[STOPPED_KEY] = True


def finished(key: tuple) -> MeanPatching | None:
    """This session's result for ``key`` (partial when stopped), or None."""
    kept = st.session_state.get(RESULT_KEY)
    return kept[1] if kept is not None and kept[0] == key else None


def run_mean(key: tuple, resolved: Any, dataset: Dataset) -> MeanPatching:
    """Mean patching with a progress bar and a Stop button. Each finished pair is kept in the session as it goes, so
    a Stop (any click reruns the page and ends this run at its next progress message) keeps the pairs done."""
    st.session_state[STOPPED_KEY] = False
    bar = st.progress(0.0, text="Mean patching: starting…")
    stop_slot = st.empty()
    stop_slot.button("Stop", key=STOP_BUTTON_KEY, on_click=_stop, icon=":material/stop:",
                     help="Keeps the pairs finished; the one under way is dropped.")

    def progress(done: float, total: int) -> None:
        bar.progress(min(done / total, 1.0), text=f"Mean patching: pair {min(int(done) + 1, total)} of {total}")

    def keep(result: MeanPatching) -> None:
        st.session_state[RESULT_KEY] = (key, result)

    result = mean_patching(resolved, dataset, progress=progress, keep=keep)
    keep(result)
    bar.empty()
    stop_slot.empty()
    return result


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
    picked = dataset_fields()
    if picked is None:
        return
    source_key, dataset = picked
    checked: Validated = validate(dataset, resolved.tokenizer)
    if not checked.pairs:
        st.error(f"No pair of {dataset.source or 'the dataset'} can run on this model: every one has a problem "
                 "(listed below). Fix the pairs, or pick a generator.", icon=":material/error:")
        show_problems(checked.messages, "cannot run")
        return
    shared = checked.n_tokens
    st.caption(f"{len(dataset.pairs) + len(dataset.problems)} pairs, {len(checked.pairs)} valid; "
               + (f"{shared} tokens each (one template)." if shared is not None else
                  "of different token counts, so the residual stream is left out."))
    key = (model, source_key)
    result = finished(key)
    if result is None:
        show_problems(checked.messages, "cannot run")
    wanted = (result is None or result.partial) and st.button(
        f"Run mean patching ({len(checked.pairs)} pairs)", type="primary", key=RUN_KEY,
        help="Exact patching of every pair, one after another; a Stop keeps the pairs finished.")
    if wanted:
        result = run_mean(key, resolved, dataset)
        if not result.partial:
            st.rerun()  # drawn again from the finished result, without the Run button
    if result is None:
        return
    show_result(result, "Columns: the positions, labelled with the first pair's clean tokens.")
    if result.n == 0 and not result.partial:
        st.error("No pair ran: every valid pair's clean and corrupted metrics were equal (listed above).",
                 icon=":material/error:")
