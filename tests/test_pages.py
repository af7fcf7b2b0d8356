"""AppTest of the "Attention" section's pages, bad text, and links that carry (or break) the state.

Streamlit 1.67's AppTest resets ``PagesManager.uses_pages_directory`` before every run, so with a
``pages/`` folder every run after the first executes the current page file alone (legacy
multipage mode): app.py's sidebar is not drawn and the page would read the context of the run
before. ``_run`` therefore drops the stored context first; ``ui.context.get_context`` then does
what it does for a fresh server's first visitor (switches legacy mode off and reruns), so each
run goes through app.py, its sidebar and its trace, as in the browser.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
TIMEOUT = 180
# A small custom encoder where the model's size does not matter (each run takes well under a second).
SMALL = {"ctl_num_hidden_layers": 2, "ctl_num_attention_heads": 2, "ctl_hidden_size": 32}

# page -> (title, what must be drawn: minimum number of plotly charts)
PAGES = {
    "pages/home.py": ("Attention Explorer", 1),
    "pages/heatmaps.py": ("Attention heatmaps", 3),  # overview, focused head, the per-head summary
    "pages/causal.py": ("Causal mask & masked scores", 4),
    "pages/inside.py": ("Inside the encoder", 6),  # the steps open at first: tokens and the focused head
}
INSIDE_STEPS = 7  # tokens, embeddings, one head, concat + W_O, feed-forward, LayerNorm, classifier


def _page_params():
    return [pytest.param(page, id=Path(page).stem) for page in PAGES]


def _app(**state) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for key, value in state.items():
        at.session_state[key] = value
    return at


def _clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert not at.sidebar.error, [e.value for e in at.sidebar.error]


def _run(at: AppTest) -> AppTest:
    """One run through app.py (see the module docstring)."""
    if "_app_context" in at.session_state:
        del at.session_state["_app_context"]
    at.run()
    assert len(at.sidebar.radio) >= 1, "app.py's sidebar was not drawn"
    return at


def _open(at: AppTest, page: str) -> AppTest:
    if page != "pages/home.py":
        at.switch_page(page)
        _run(at)
    return at


def _check_page(at: AppTest, page: str, model: str) -> None:
    _clean(at)
    title, min_charts = PAGES[page]
    assert [t.value for t in at.title] == [title]
    charts = at.get("plotly_chart")
    assert len(charts) >= min_charts, f"{page} drew {len(charts)} charts, expected at least {min_charts}"
    assert at.session_state["_app_context"].trace.model_kind == model
    if page == "pages/inside.py":
        assert len(at.main.expander) == INSIDE_STEPS, [e.label for e in at.main.expander]
        text = " ".join(m.value for m in at.markdown)
        assert "LayerNorm" not in text  # step 6 is closed: nothing of it was built
        if model == "bert":
            assert "custom_from_bert" in " ".join(i.value for i in at.info)
        # Open every step: all 19 figures, and step 6 names the model's LayerNorm placement.
        for step in range(1, INSIDE_STEPS + 1):
            at.session_state[f"inside_step{step}"] = True
        _run(at)
        _clean(at)
        assert len(at.get("plotly_chart")) >= 15
        text = " ".join(m.value for m in at.markdown)
        assert ("post-LayerNorm" if model == "bert" else "pre-LayerNorm") in text


@pytest.mark.parametrize("page", _page_params())
def test_page_with_default_inputs(page):
    at = _app()
    _run(at)
    _open(at, page)
    _check_page(at, page, "bert")


def test_the_per_head_summary_is_one_figure_of_the_traces_four_statistics():
    import json

    from app_runs import plotly_z
    from model_core.analysis import head_stats

    at = _open(_run(_app()), "pages/heatmaps.py")
    _clean(at)
    trace = at.session_state["_app_context"].trace
    summary = [c for c in at.get("plotly_chart") if "head_summary" in c.proto.id]
    assert len(summary) == 1
    spec = json.loads(summary[0].proto.spec)
    grids = [t for t in spec["data"] if t["type"] == "heatmap"]
    s = head_stats(trace)  # computed here, apart from the page's cache
    for grid, name in zip(grids, ("entropy", "max_weight", "to_cls", "to_sep"), strict=True):
        np.testing.assert_allclose(plotly_z(grid), getattr(s, name), rtol=1e-6, equal_nan=True)
    assert [a["text"] for a in spec["layout"]["annotations"]] == [
        "Entropy (bits)", "Largest weight", "Share to [CLS]", "Share to [SEP]"]
    assert any("one row per head" in b.proto.label for b in at.get("download_button"))


@pytest.mark.parametrize("page", _page_params())
def test_page_after_switching_to_the_custom_encoder(page):
    at = _app(**SMALL)
    _run(at)
    assert at.session_state["_app_context"].trace.model_kind == "bert"
    at.sidebar.radio(key="ctl_model").set_value("custom")
    _run(at)
    _clean(at)
    trace = at.session_state["_app_context"].trace
    assert (trace.model_kind, trace.n_layers, trace.n_heads, trace.hidden_size) == ("custom", 2, 2, 32)
    _open(at, page)
    _check_page(at, page, "custom")


# -- bad text -------------------------------------------------------------------------------------
def test_empty_sentence_a_says_what_to_type_on_home():
    at = _app(ctl_text_a="   ", **SMALL)
    _run(at)
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["_app_context"].trace is None
    assert any("Sentence A is empty" in i.value for i in at.info), [i.value for i in at.info]
    assert any("Sentence A is empty" in e.value for e in at.sidebar.error)


@pytest.mark.parametrize("page", [p for p in _page_params() if p.values[0] != "pages/home.py"])
def test_empty_sentence_a_stops_the_page_with_the_reason(page):
    at = _app(ctl_text_a="", ctl_model="custom", **SMALL)
    _run(at)
    _open(at, page)
    assert not at.exception, [e.value for e in at.exception]
    assert [i.value for i in at.info] == ["Sentence A is empty; type sentence A (sentence B is optional)."]
    assert not at.get("plotly_chart")


def test_a_custom_shape_the_heads_do_not_divide_says_so_and_the_corpus_page_keeps_working():
    """The sidebar's request itself is refused (hidden 30 over 4 heads): the message reaches the sidebar
    and the page, and the corpus page, which needs no trace, says its model cannot be used."""
    at = _app(ctl_model="custom", ctl_num_hidden_layers=2, ctl_num_attention_heads=4, ctl_hidden_size=30)
    _run(at)
    assert not at.exception, [e.value for e in at.exception]
    context = at.session_state["_app_context"]
    assert context.trace is None and context.request is None
    assert any("divisible" in e.value for e in at.sidebar.error), [e.value for e in at.sidebar.error]
    at.switch_page("pages/corpus.py")
    _run(at)
    assert not at.exception, [e.value for e in at.exception]
    assert any("cannot be used" in i.value for i in at.info), [i.value for i in at.info]


def test_typing_a_sentence_again_brings_the_trace_back():
    at = _app(ctl_text_a="", ctl_model="custom", **SMALL)
    _run(at)
    assert at.session_state["_app_context"].trace is None
    at.sidebar.text_area(key="ctl_text_a").input("the cat sat")
    _run(at)
    _clean(at)
    assert at.session_state["_app_context"].trace.tokens[:4] == ("[CLS]", "the", "cat", "sat")


# -- links ----------------------------------------------------------------------------------------
def _linked(**params: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for name, value in params.items():
        at.query_params[name] = value
    return at


def test_link_restores_model_size_layer_and_head():
    at = _linked(model="custom", layers="4", heads="2", hidden="32", layer="3", head="1", a="the cat sat")
    _run(at)
    _clean(at)
    assert not at.toast, [t.value for t in at.toast]
    ctx = at.session_state["_app_context"]
    assert (ctx.trace.model_kind, ctx.trace.n_layers, ctx.layer, ctx.head) == ("custom", 4, 3, 1)
    assert at.sidebar.radio(key="ctl_model").value == "custom"
    assert at.sidebar.selectbox(key="sel_layer").value == 3
    assert "Layer 3, head 1" in [s.value for s in at.subheader]
    # The URL keeps the state (non-defaults only), so reloading the link gives the same view.
    assert (at.query_params["layer"], at.query_params["model"], at.query_params["head"]) == ("3", "custom", "1")


def test_link_opens_a_page_with_its_state():
    at = _linked(model="custom", layers="4", heads="2", hidden="32", layer="3")
    _run(at)
    _open(at, "pages/inside.py")
    _clean(at)
    assert at.main.expander[2].label.startswith("3 · Layer 3, head 0")


def test_out_of_range_layer_in_a_link_warns_and_uses_the_default():
    at = _linked(layer="10000", model="custom", layers="2", heads="2", hidden="32")
    _run(at)
    _clean(at)
    assert [t.value for t in at.toast] == ["Ignored the link's `layer` (10000 is outside 0-9999); using the default."]
    ctx = at.session_state["_app_context"]
    assert (ctx.trace.model_kind, ctx.layer) == ("custom", 0)
    assert "layer" not in at.query_params  # the bad value is dropped from the URL


def test_unknown_model_in_a_link_warns_and_uses_the_default():
    at = _linked(model="gpt2", heads="x")
    _run(at)
    _clean(at)
    toasts = " ".join(t.value for t in at.toast)
    assert "`model` ('gpt2' is not one of pretrained, custom" in toasts
    assert "`heads`" in toasts
    assert at.session_state["_app_context"].trace.model_kind == "bert"


def test_layer_beyond_the_models_depth_is_clamped_to_its_last_layer():
    # 0-23 parses, but this model has 2 layers: the picker clamps rather than failing.
    at = _linked(model="custom", layers="2", heads="2", hidden="32", layer="5", head="9")
    _run(at)
    _clean(at)
    ctx = at.session_state["_app_context"]
    assert (ctx.layer, ctx.head) == (1, 1)



def test_causal_page_shows_a_window_of_a_long_input_with_true_positions():
    """Past 64 tokens the panels show 64 tokens at a time (8 x 512² took 2 s per head in the browser, 6 x 128²
    about half a second), labelled with their real positions; the window moves with the slider."""
    import json

    at = _app(ctl_text_a=" ".join(["word"] * 180), ctl_text_b="")
    _run(at)
    _open(at, "pages/causal.py")
    _clean(at)
    assert at.slider(key="causal_window").value == 0
    spec = json.loads(at.get("plotly_chart")[-1].proto.spec)
    labels = spec["data"][0]["y"]
    assert len(labels) == 64 and labels[0] == "0: [CLS]" and labels[-1] == "63: word"
    at.slider(key="causal_window").set_value(54)
    _run(at)
    _clean(at)
    labels = json.loads(at.get("plotly_chart")[-1].proto.spec)["data"][0]["y"]
    assert (labels[0], labels[-1]) == ("54: word", "117: word")


def test_a_page_listed_in_app_py_whose_file_is_missing_fails_loudly(tmp_path):
    source = (ROOT / "app.py").read_text()
    listed = '("pages/home.py", "Home", ":material/home:", "Attention", True),'
    assert listed in source
    (tmp_path / "app.py").write_text(source.replace(listed, listed + ' ("pages/gone.py", "Gone", "", "Attention", False),'))
    (tmp_path / "pages").symlink_to(ROOT / "pages")
    (tmp_path / ".streamlit").symlink_to(ROOT / ".streamlit")
    at = AppTest.from_file(str(tmp_path / "app.py"), default_timeout=TIMEOUT)
    at.run()
    assert at.exception and "pages/gone.py" in at.exception[0].value


def test_every_page_in_app_py_has_a_test_here_or_in_the_analysis_and_corpus_tests():
    from harness.browser import app_pages
    from test_pages_analysis import PAGES as ANALYSIS

    listed = {path for path, _ in app_pages()}
    tested = set(PAGES) | set(ANALYSIS) | {"pages/bertviz.py", "pages/corpus.py", "pages/corpus_space.py",
                                                 "pages/predictions.py",
                                                 # each has its own AppTest file: test_<page>_page.py
                                                 "pages/contributions.py", "pages/attribution.py", "pages/patching.py",
                                                 "pages/generate.py", "pages/kv_cache.py",
                                                 "pages/circuits.py", "pages/why_this_key.py",
                                                 "pages/head_atlas.py"}
    assert listed == tested, listed ^ tested
    assert all((ROOT / path).exists() for path in listed)


def test_a_new_text_frees_the_old_trace_when_the_cache_is_full(monkeypatch):
    """The trace cache is bounded by bytes, the callbacks of widgets that are gone are let go (Streamlit keeps them,
    and the overview's click callback holds the old run's page globals), and a run that built a trace collects the
    runs before it: the old text's trace, out of the cache, is freed at once, not at the session's end or Python's
    next full collection. Fails if Streamlit's private widget state changes shape (``drop_stale_widget_callbacks``
    then does nothing)."""
    import gc
    import weakref

    from harness.waits import wait_until

    import ui.loaders

    monkeypatch.setenv("AE_TRACE_CACHE_MB", "0.001")  # room for the latest trace only
    monkeypatch.setattr(ui.loaders, "COLLECT_DELAY_S", 0.0)
    gc.collect()
    gc.disable()  # no automatic collection: only collect_after_run's may free what sits in cycles
    try:
        at = _app(ctl_text_a="the cat sat on the mat", ctl_model="custom", **SMALL)
        at.switch_page("pages/heatmaps.py")
        _run(at)
        _clean(at)
        old = weakref.ref(at.session_state["_app_context"].trace)
        at.sidebar.text_area(key="ctl_text_a").input("a dog ran in the park")
        _run(at)
        _clean(at)
        new = at.session_state["_app_context"].trace
        assert new.tokens[1:3] == ("a", "dog") and len(ui.loaders.TRACES) == 1
        wait_until(lambda: old() is None, 10, "the old trace freed")
    finally:
        gc.enable()
