"""The "Why this key" page (AppTest) on SmolLM2 and on the bundled BERT: the split, its check line, the versus view,
the row view, the ready induction example and a bad choice of keys."""

from __future__ import annotations

import pytest
from conftest import assert_page_ok
from streamlit.testing.v1 import AppTest

from harness.apptest import APP
from model_core.settings import BUNDLED_DECODER_ID
from ui.qk import INDUCTION_TEXT

PAGE = "pages/why_this_key.py"
TITLE = "Why this key"
TEXT = "The cat sat on the mat. The cat sat on the"


def _through_app(at: AppTest) -> AppTest:
    """The next run goes through app.py (its sidebar, its picker, the trace) and then the page, as in the browser:
    AppTest runs the page alone after its first run unless the stored context is gone (see tests/test_pages.py)."""
    if "_app_context" in at.session_state:
        del at.session_state["_app_context"]
    return at


def _visit(model_id: str | None, query: dict | None = None) -> AppTest:
    """A user's visit: app.py's first run (Home) from a link, then the page opened, both through app.py."""
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params["model"] = "pretrained"
    if model_id is not None:
        at.query_params["model_id"] = model_id
    for name, value in (query or {}).items():
        at.query_params[name] = str(value)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    _through_app(at).switch_page(PAGE).run()
    assert_page_ok(at, TITLE)
    assert at.sidebar.selectbox(key="sel_layer") is not None  # app.py drew the picker this run
    return at


def _open(model_id: str | None, text: str = TEXT, layer: int = 3, head: int = 2) -> AppTest:
    return _visit(model_id, {"text_a": text, "text_b": "", "layer": layer, "head": head})


def _check(at: AppTest) -> tuple[float, float]:
    line = next(c.value for c in at.caption if c.value.startswith("Check:"))
    parts = [float(x.split()[0].rstrip(";.")) for x in line.split("sum to ")[1].split("score is ")]
    return parts[0], parts[1]


@pytest.mark.slow
def test_the_page_splits_a_decoders_score_and_its_rivals():
    at = _open(BUNDLED_DECODER_ID)
    total, score = _check(at)
    assert abs(total - score) <= 1e-4
    labels = [m.label for m in at.metric]
    assert labels[:2] == ["score s", "weight a"] and any(lbl.startswith("vs key") for lbl in labels)
    assert any("gives" in m.value for m in at.markdown)  # the top pairs in words
    assert at.selectbox(key="qk_query").value == len(at.selectbox(key="qk_query").options) - 1  # the last token
    _through_app(at).selectbox(key="qk_key").set_value(0).run()
    assert_page_ok(at, TITLE)
    _through_app(at).selectbox(key="qk_versus").set_value(0).run()  # the same key twice: a message, not a traceback
    assert any("two different keys" in w.value for w in at.warning)


@pytest.mark.slow
def test_the_page_reads_an_encoder():
    at = _open(None, "time flies like an arrow", layer=1, head=0)
    total, score = _check(at)
    assert abs(total - score) <= 1e-4
    assert at.selectbox(key="qk_query").value == 0  # an encoder's default query: the first token
    _through_app(at).toggle(key="qk_roles").set_value(True).run()  # the Head roles probe names the heads
    assert_page_ok(at, TITLE)
    assert any("gives" in m.value for m in at.markdown)


@pytest.mark.slow
def test_the_ready_example_focuses_the_strongest_induction_head():
    at = _visit(BUNDLED_DECODER_ID)  # as a user comes: the default pair, no focus chosen
    _through_app(at).button(key="qk_example").click().run()
    assert_page_ok(at, TITLE)
    assert at.sidebar.text_area(key="ctl_text_a").value == INDUCTION_TEXT
    layer, _head = at.session_state["_focused_head"]  # ui.focus keeps the focused head here
    assert layer > 0  # an induction head reads a previous-token head's writes: never in layer 0
    assert (at.sidebar.selectbox(key="sel_layer").value, at.sidebar.selectbox(key="sel_head").value) == (layer, _head)
    _through_app(at).toggle(key="qk_row").set_value(True).run()
    assert_page_ok(at, TITLE)
    assert any(c.value.startswith("Each component's key-side share") for c in at.caption)
