"""The widgets of a dataset of prompt pairs, shared by the Circuits page and the patching page's dataset mode: where
the pairs come from (a generator with its count and seed, or an uploaded JSONL or CSV), the check of every pair on
the model's tokenizer, and the list of the pairs that do not run."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, TypeVar

import streamlit as st

from model_core.circuits.budget import first_pairs
from model_core.circuits.datasets import (
    Dataset,
    DatasetError,
    Validated,
    from_generator,
    parse_pairs,
    validate,
)
from model_core.circuits.generators import GENERATORS
from model_core.settings import load_settings

MAX_UPLOAD_MB = 25
"""The largest file of pairs the uploader takes: 25 MB holds about 200,000 short pairs, far past what a page runs
(``AE_MAX_PAIRS``); Streamlit's own limit (200 MB) would let one upload hold GBs while it is parsed."""
R = TypeVar("R")
"""A run's result: it has ``partial`` (True when a Stop ended the run)."""
GENERATOR_TITLES = {"ioi": "Names (IOI)", "greater-than": "Greater-than (years)", "induction": "Induction (words)",
                    "facts": "Factual recall"}


def pair_source(prefix: str, default_count: int) -> tuple[tuple, Dataset] | None:
    """The source of the pairs: a generator (count, seed) or an upload, each widget keyed ``{prefix}source``,
    ``{prefix}generator``, ``{prefix}count``, ``{prefix}seed`` or ``{prefix}upload``. Returns (a key naming the
    pairs, the dataset), or None (nothing uploaded yet, or a file that cannot be read: the message is shown)."""
    source = st.radio("Pairs from", ["generator", "upload"], horizontal=True, key=f"{prefix}source",
                      format_func={"generator": "A generator", "upload": "My file (JSONL or CSV)"}.get)
    if source == "generator":
        left, mid, right = st.columns([2, 1, 1])
        name = left.selectbox("Generator", list(GENERATORS), key=f"{prefix}generator",
                              format_func=GENERATOR_TITLES.get,
                              help="Written by the team; the same pairs for the same seed.")
        max_pairs = load_settings().max_pairs  # AE_MAX_PAIRS caps an upload too
        count = mid.number_input("Pairs", 1, max_pairs, min(default_count, max_pairs), key=f"{prefix}count",
                                 help="At most AE_MAX_PAIRS on this server; the command line has no cap.")
        seed = right.number_input("Seed", 0, 2**31 - 1, 0, key=f"{prefix}seed")
        spec = f"{name}:{int(count)}:{int(seed)}"
        try:
            return ("generator", spec), from_generator(spec)
        except DatasetError as exc:
            st.error(str(exc), icon=":material/error:")
            return None
    upload = st.file_uploader("Pairs: JSONL (one object a line) or CSV, with clean, corrupt, answer, foil",
                              key=f"{prefix}upload", max_upload_size=MAX_UPLOAD_MB)
    if upload is None:
        st.info('Upload a file of pairs: JSONL lines such as {"clean": "...", "corrupt": "...", "answer": " Mary", '
                '"foil": " John"}, or a CSV whose header is clean,corrupt,answer,foil.', icon=":material/upload:")
        return None
    data = upload.getvalue()
    if len(data) > MAX_UPLOAD_MB * 1_000_000:  # Streamlit refuses it first; a check of our own all the same
        st.error(f"{upload.name} is {len(data) / 1e6:,.1f} MB, over the {MAX_UPLOAD_MB} MB this page reads. Keep "
                 "the pairs you want to run, or run the file on the command line.", icon=":material/error:")
        return None
    try:
        dataset = parse_pairs(data, upload.name)
    except DatasetError as exc:
        st.error(str(exc), icon=":material/error:")
        return None
    max_pairs = load_settings().max_pairs
    dataset, left_out = first_pairs(dataset, max_pairs)
    if left_out:
        st.info(f"{upload.name} has {max_pairs + left_out:,} rows; this page runs the first {max_pairs:,} "
                f"(AE_MAX_PAIRS on this server) and leaves out the other {left_out:,}. The command line runs them "
                f"all: python -m model_core circuit --dataset {upload.name} … (or patch --dataset).",
                icon=":material/content_cut:")
    return ("upload", upload.name, hashlib.sha256(data).hexdigest()), dataset


def show_problems(problems: list[str] | tuple[str, ...], ran: str) -> None:
    """Every pair that does not run, one line each, under a warning that says how many."""
    if problems:
        st.warning(f"{len(problems)} pair{'s' if len(problems) != 1 else ''} {ran}; the others run. Each line "
                   "names the pair's row and what to change.", icon=":material/warning:")
        st.code("\n".join(problems), language=None, wrap_lines=True)


def checked_pairs(dataset: Dataset, tokenizer: Any) -> Validated | None:
    """Every pair of ``dataset`` checked on the model's tokenizer; None, with an error and each pair's problem shown,
    when no pair can run."""
    checked = validate(dataset, tokenizer)
    if not checked.pairs:
        st.error(f"No pair of {dataset.source or 'the dataset'} can run on this model: every one has a problem "
                 "(listed below). Fix the pairs, or pick a generator.", icon=":material/error:")
        show_problems(checked.messages, "cannot run")
        return None
    return checked


def run_when_asked(kept: R | None, checked: Validated, label: str, key: str, help: str,
                   run: Callable[[], R]) -> R | None:
    """The result ``kept`` in the session, or the one ``run`` makes when the Run button (``label``, ``key``) is
    clicked; None before any run. Until there is a result the pairs that cannot run are listed above the button; the
    button stays while the result is partial (stopped), and a finished run draws the page again without it."""
    if kept is None:
        show_problems(checked.messages, "cannot run")
    if (kept is None or kept.partial) and st.button(label, type="primary", key=key, help=help):
        kept = run()
        if not kept.partial:
            st.rerun()  # drawn again from the finished result, without the Run button
    return kept


def pair_counts(dataset: Dataset, checked: Validated) -> str:
    """How many pairs the dataset has and how many are valid, to begin the caption above the Run button."""
    return f"{len(dataset.pairs) + len(dataset.problems)} pairs, {len(checked.pairs)} valid; "
