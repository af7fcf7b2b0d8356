"""AppTest of every analysis page, for pretrained BERT and for the custom encoder."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from test_decoder_pages import PAGES as ALL_PAGES

pytestmark = pytest.mark.slow

APP = str(Path(__file__).resolve().parents[1] / "app.py")
# The analysis pages, titled as the decoder test names every page.
PAGES = {page: title for page, title in ALL_PAGES.items() if page.startswith(("pages/analysis_", "pages/head_roles"))}


def _open(page: str, model: str = "bert", **state) -> AppTest:
    """Run app.py (sidebar, trace) on the home page, then open ``page``.

    In Streamlit 1.67's AppTest, a run after ``switch_page`` executes the page file alone (app.py's
    sidebar is not drawn), so the page reads the context app.py stored on the run before. The
    model and texts are therefore chosen before that first run, through session state.
    """
    at = AppTest.from_file(APP, default_timeout=180)
    at.session_state["ctl_model"] = model
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["_app_context"].trace.model_kind == model
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _ok(at: AppTest, page: str) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert [h.value for h in at.header] == [PAGES[page]]
    assert at.expander[0].label == "How to read it"
    assert "Source:" in " ".join(c.value for c in at.caption)


def _charts(at: AppTest) -> list:
    return list(at.get("plotly_chart"))


@pytest.mark.parametrize("model", ["bert", "custom"])
@pytest.mark.parametrize("page", list(PAGES))
def test_page_renders_for_both_models(page, model):
    at = _open(page, model, mask_off_heads=[(0, 0), (1, 3)])
    _ok(at, page)
    assert _charts(at), "the page drew no chart"
    assert len(at.get("download_button")) >= 2


def test_contexts_lists_repeated_words_and_switches_support():
    at = _open("pages/analysis_contexts.py")
    assert at.selectbox(key="ctx_word").options == ["flies", "like"]
    at.selectbox(key="ctx_word").set_value("like").run()
    at.radio(key="ctx_support").set_value("offsets").run()
    assert not at.exception
    assert "like (a, tokens 3-3)" in " ".join(c.value for c in at.caption)


def test_contexts_without_a_repeated_word_offers_the_bank_example():
    at = _open("pages/analysis_contexts.py", ctl_text_a="a single sentence", ctl_text_b="")
    assert "No word occurs twice" in at.info[0].value
    at.button[0].click().run()
    assert not at.exception
    assert at.session_state["ctl_text_a"] == "she sat on the river bank and watched the water"


def test_rollout_shows_flow_for_the_default_pair():
    at = _open("pages/analysis_rollout.py")
    assert len(_charts(at)) == 3  # rollout, flow, relevance to [CLS]


def test_rollout_states_the_flow_limit_for_long_text():
    at = _open("pages/analysis_rollout.py", ctl_text_a=" ".join(["word"] * 60))
    assert any("limited to 48 tokens" in i.value for i in at.info)
    assert len(_charts(at)) == 2  # rollout and relevance (rollout + flow into [CLS])


def test_head_stats_open_button_focuses_the_sidebars_head_in_heatmaps():
    at = _open("pages/analysis_head_stats.py")
    assert at.selectbox(key="stats_name").options[:2] == ["Entropy (bits)", "Share to [CLS]"]
    assert len(at.selectbox(key="sel_layer").options) == 6  # the one picker, in the sidebar, and no second one
    assert [s.label for s in at.main.selectbox] == ["Statistic"]
    at.selectbox(key="sel_layer").set_value(3)
    at.selectbox(key="sel_head").set_value(7).run()
    assert at.button(key="stats_open").label == "Open layer 3, head 7 in the heatmaps"
    at.button(key="stats_open").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert (at.session_state["sel_layer"], at.session_state["sel_head"]) == (3, 7)
    assert at.title[0].value == "Attention heatmaps"


def test_masking_opens_on_the_focused_head_and_asks_when_none_is_off():
    at = _open("pages/analysis_masking.py")
    assert not at.exception, [e.value for e in at.exception]
    assert list(at.multiselect(key="mask_off_heads").value) == [(0, 0)]
    assert len(_charts(at)) == 3  # [CLS] hidden state, TV grid, JS grid
    at.multiselect(key="mask_off_heads").set_value([]).run()
    assert "Pick at least one head" in at.info[0].value
    at.selectbox(key="mask_whole_layer").set_value(0).run()
    assert not at.exception
    assert len(_charts(at)) == 3


def test_masking_shows_logits_for_the_custom_encoder():
    at = _open("pages/analysis_masking.py", "custom", mask_off_heads=[(0, 1)])
    assert at.metric[0].label == "Largest logit change"
    assert len(_charts(at)) == 4
