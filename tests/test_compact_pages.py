"""A long input in the app: past AE_FULL_TRACE_MB the sidebar's text is traced in compact form; the heatmaps page
draws it (overview, focused head, exact window, sink, summary), the head statistics page reads it, and a page that
needs every weight says its limit and where to go."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from app_runs import open_page
from streamlit.testing.v1 import AppTest

TEXT = ("The river rose in the night. The valley waited for the morning!\nChildren counted the stones on the bank. "
        "Herons stood in the shallows below the weir.\n")


@pytest.fixture
def compact_env(monkeypatch):
    # 0.2 MB: a tiny decoder's 2 x 4 heads pass it at about 79 tokens; the text below has more (under its 128 positions).
    monkeypatch.setenv("AE_FULL_TRACE_MB", "0.2")


def _open(folder: Path, page: str, text: str = TEXT) -> AppTest:
    return open_page(page, {"model": "pretrained", "model_id": str(folder), "a": text})


def _context(at: AppTest):
    return at.session_state["_app_context"]


def test_a_long_input_is_traced_compact_and_drawn_on_the_heatmaps_page(compact_env, tiny_decoders):
    at = _open(tiny_decoders["llama"], "pages/heatmaps.py")
    ctx = _context(at)
    assert ctx.trace is None and ctx.compact is not None, ctx.error
    assert any("Compact form" in i.value for i in at.info)
    keys = {c.key for c in at.get("plotly_chart") if hasattr(c, "key")} | {
        c.proto.id for c in at.get("plotly_chart")}
    assert len(at.get("plotly_chart")) >= 5, keys  # overview, pooled head, sink, window, the statistics in one
    assert any("compact_head_summary" in str(k) for k in keys), keys
    assert "compact form" in " ".join(c.value for c in at.sidebar.caption)


def test_the_window_is_exact_and_can_leave_out_the_sink(compact_env, tiny_decoders):
    at = _open(tiny_decoders["llama"], "pages/heatmaps.py")
    n = _context(at).compact.n_tokens
    at.slider(key="cw_rows").set_value((n - 20, n))
    at.slider(key="cw_cols").set_value((0, 30))
    at.toggle(key="compact_no_sink").set_value(True)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    titles = [c.proto.spec for c in at.get("plotly_chart")]
    assert any("renormalised without the first token" in s for s in titles)


def test_grouping_by_sentence_draws_sentences(compact_env, tiny_decoders):
    at = _open(tiny_decoders["gpt2"], "pages/heatmaps.py")
    at.radio(key="compact_group").set_value("sentences")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("By sentence" in c.proto.spec for c in at.get("plotly_chart"))


@pytest.mark.parametrize("page", ["pages/analysis_norms.py", "pages/bertviz.py", "pages/inside.py"])
def test_a_page_that_needs_every_weight_says_its_limit(compact_env, tiny_decoders, page):
    at = _open(tiny_decoders["llama"], page)
    info = " ".join(i.value for i in at.info)
    assert "compact form" in info and "shows inputs of up to" in info
    assert at.get("page_link"), "no link to the pages that read the compact form"


def test_a_short_input_stays_full(compact_env, tiny_decoders):
    at = _open(tiny_decoders["llama"], "pages/heatmaps.py", text="time flies like an arrow")
    ctx = _context(at)
    assert ctx.trace is not None and ctx.compact is None
    np.testing.assert_allclose(ctx.trace.weights.sum(-1), 1.0, atol=1e-5)


def test_head_statistics_read_the_compact_form(compact_env, tiny_decoders):
    at = _open(tiny_decoders["llama"], "pages/analysis_head_stats.py")
    assert _context(at).compact is not None
    specs = " ".join(c.proto.spec for c in at.get("plotly_chart"))
    assert "Entropy (bits)" in specs and "Largest weight" not in specs  # a second pass, on request
    assert len(at.get("plotly_chart")) == 1  # the six statistics, one figure
    assert len(at.get("plotly_chart")[0].proto.spec) > 0
    at.toggle(key="compact_largest").set_value(True)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.get("plotly_chart")) == 1
    assert "Largest weight" in " ".join(c.proto.spec for c in at.get("plotly_chart"))


def test_a_text_file_is_read_in_its_encoding_or_refused_with_a_reason():
    from ui.state import TEXT_MAX_CHARS, text_from_upload

    notepad = "The river rose.\nThe valley waited.".encode("utf-16")  # with its byte-order mark, as Notepad saves it
    assert text_from_upload(notepad, "notes.txt") == ("The river rose.\nThe valley waited.", None)
    assert text_from_upload("plain é".encode(), "a.txt") == ("plain é", None)
    text, note = text_from_upload(b"\x00\x01binary", "x.txt")
    assert text is None and "binary" in note
    text, note = text_from_upload(b"a" * (TEXT_MAX_CHARS + 5), "long.txt")
    assert len(text) == TEXT_MAX_CHARS and "first" in note


def test_the_sidebar_offers_a_text_file(tiny_decoders):
    at = _open(tiny_decoders["llama"], "pages/heatmaps.py", text="time flies like an arrow")
    assert any(getattr(e, "proto", None) is not None and "text file" in str(e.proto) for e in at.sidebar)


def test_the_causal_page_shows_an_exact_window_of_a_long_input(compact_env, tiny_decoders):
    at = _open(tiny_decoders["llama"], "pages/causal.py")
    ctx = _context(at)
    assert ctx.compact is not None
    assert len(at.get("plotly_chart")) == 6  # the unmasked row's masked scores are the scores: said, not drawn
    assert any("computed exactly from the compact trace" in c.value for c in at.caption)
    at.slider(key="causal_long_window").set_value(0)
    at.run()
    assert not at.exception, [e.value for e in at.exception]


def test_the_rollout_page_computes_the_row_into_a_token_of_a_long_input(compact_env, tiny_decoders, monkeypatch):
    from model_core.analysis import attention_rollout
    from model_core.compact.views import rollout_row

    at = _open(tiny_decoders["llama"], "pages/analysis_rollout.py")
    compact = _context(at).compact
    assert compact is not None and not at.get("plotly_chart")  # nothing is computed before the click
    at.number_input(key="compact_rollout_target").set_value(40)
    at.button(key="compact_rollout_run").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Relevance of each token" in at.get("plotly_chart")[0].proto.spec
    table = at.dataframe[0].value
    row = rollout_row(compact, 40)
    assert table["position"].iloc[0] == int(np.argmax(row)) and abs(table["share"].iloc[0] - row.max()) < 1e-9
    assert (row[41:] == 0).all() and abs(row.sum() - 1) < 1e-9  # causal: nothing from after the token
    assert not [b for b in at.button if b.key == "compact_rollout_run"]  # the button goes once the row is there
    assert not any(mark in token for token in table["token"] for mark in "ĠĊ▁")  # tokens as the text reads
    # against the full trace's rollout of the same text
    from model_core import build_trace

    monkeypatch.setenv("AE_FULL_TRACE_MB", "320")  # the same text traced in full, as a short input would be
    full = build_trace(_context(at).request)
    np.testing.assert_allclose(row, attention_rollout(full.weights)[-1, 40], atol=1e-6)


def test_window_steps_equal_the_full_traces_steps(tiny_decoders):
    from model_core import TraceRequest, build_trace
    from model_core.analysis.mask_steps import mask_steps, window_steps
    from model_core.compact.build import build_compact

    request = TraceRequest("pretrained", TEXT, model_id=str(tiny_decoders["llama"]))
    full, compact = build_trace(request, device="cpu"), build_compact(request, device="cpu")
    for apply in (None, False):
        a, b = mask_steps(full, 1, 2, apply_causal=apply), window_steps(compact, 1, 2, 0, full.n_tokens, apply)
        np.testing.assert_allclose(b.weights, a.weights, atol=1e-5)
        np.testing.assert_array_equal(b.mask, a.mask)
        np.testing.assert_allclose(b.scores, a.scores, atol=1e-4)
        assert b.illustrative == a.illustrative and b.causal == a.causal
    part = window_steps(compact, 1, 2, 10, 20)
    np.testing.assert_allclose(part.weights, full.weights[1, 2, 10:30, 10:30], atol=1e-5)


def test_the_head_roles_page_scores_a_long_text_from_its_compact_trace(compact_env, tiny_decoders):
    from model_core.roles import ROLE_TITLES, TEXT_ROLES

    at = _open(tiny_decoders["llama"], "pages/head_roles.py")
    assert _context(at).compact is not None and not at.info  # the probe needs no full trace of the sidebar's text
    at.toggle(key="roles_text").set_value(True)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert set(at.radio(key="roles_text_role").options) == {ROLE_TITLES[r] for r in (*TEXT_ROLES, "induction")}
    at.radio(key="roles_text_role").set_value("induction")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("Induction score on your text" in c.proto.spec for c in at.get("plotly_chart"))


@pytest.fixture
def on_a_gpu(compact_env):
    """The app's model on a simulated CUDA GPU (``tests/gpu_sim.py``) for one test; the caches emptied before and
    after, so it meets no trace made on the CPU and no other test meets one made there."""
    import streamlit as st
    from gpu_sim import simulated_cuda

    from ui.loaders import TRACES

    def clear() -> None:  # models are cached by device, traces by request alone (one device a process)
        st.cache_resource.clear()
        TRACES.clear()

    clear()
    with simulated_cuda() as sim:
        try:
            yield sim
        finally:
            clear()


@pytest.mark.parametrize("page", ["pages/heatmaps.py", "pages/analysis_head_stats.py", "pages/causal.py"])
def test_a_long_input_on_a_gpu_is_summarised_there_and_drawn(on_a_gpu, tiny_decoders, page):
    """On a GPU the compact trace's layers are summarised there (``model_core.compact.build``); its pages draw it as
    on the CPU, and the largest weight, free in the GPU's streamed summary, is drawn without its toggle."""
    at = _open(tiny_decoders["llama"], page)
    ctx = _context(at)
    assert ctx.compact is not None and "max_weight" in ctx.compact.stats, ctx.error
    assert "on cuda" in ctx.compact.description
    assert "compact form · float32" in " ".join(c.value for c in at.sidebar.caption)  # auto: float32 under 1B
    assert at.get("plotly_chart")
    if page == "pages/analysis_head_stats.py":
        assert "Largest weight" in " ".join(c.proto.spec for c in at.get("plotly_chart"))
        assert not [t for t in at.toggle if t.key == "compact_largest"]
