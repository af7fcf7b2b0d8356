"""The "Why this key" page (AppTest) on SmolLM2 and on the bundled BERT: the split, its check line, the versus view,
the row view, the ready induction example and a bad choice of keys."""

from __future__ import annotations

import numpy as np
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
    assert at.subheader[0].value.startswith("Layer 3, head 2: ") and _opened_caption(at) is None  # the link's head
    assert labels[:2] == ["score s", "weight a"] and any(lbl.startswith("vs key") for lbl in labels)
    assert any("gives" in m.value for m in at.markdown)  # the top pairs in words
    assert at.selectbox(key="qk_query").value == len(at.selectbox(key="qk_query").options) - 1  # the last token
    _through_app(at).selectbox(key="qk_key").set_value(0).run()
    assert_page_ok(at, TITLE)
    _through_app(at).selectbox(key="qk_versus").set_value(0).run()  # the same key twice: a message, not a traceback
    assert any("two different keys" in w.value for w in at.warning)


@pytest.mark.slow
def test_the_page_reads_tokens_with_the_sidebars_words_on():
    """Words shorter than the tokens (a word of several tokens): the split and its row view still read tokens. The row
    view indexed the words' labels by token and failed (found by the press test pressing the sidebar, 28 Nov)."""
    at = _open(BUNDLED_DECODER_ID, "Tokenizers split unbelievably uncommon words into pieces.", layer=3, head=2)
    _through_app(at).sidebar.toggle(key="ctl_words").set_value(True).run()  # the row view is on at this length
    ctx = at.session_state["_app_context"]
    assert len(ctx.words.words) < len(ctx.trace.tokens)
    assert_page_ok(at, TITLE)
    assert any("reads tokens even with the sidebar's words on" in c.value for c in at.caption)
    assert any(c.value.startswith("Each component's key-side share") for c in at.caption)


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


def _opened_caption(at: AppTest) -> str | None:
    return next((c.value for c in at.caption if c.value.startswith("Opened on")), None)


def _sidebar_focus(at: AppTest) -> tuple[int, int]:
    return at.sidebar.selectbox(key="sel_layer").value, at.sidebar.selectbox(key="sel_head").value


@pytest.mark.slow
def test_a_first_visit_opens_on_a_later_head_and_says_why_and_a_chosen_head_stays():
    at = _visit(BUNDLED_DECODER_ID)  # a fresh session: no head chosen anywhere
    layer, head = _sidebar_focus(at)
    assert layer >= 15, (layer, head)  # SmolLM2's later half, not layer 0 head 0
    assert at.subheader[0].value.startswith(f"Layer {layer}, head {head}: ")
    caption = _opened_caption(at)
    assert caption is not None and caption.startswith(f"Opened on layer {layer} head {head}: ")
    assert caption.endswith("Pick another head in the sidebar.")
    assert at.selectbox(key="qk_query").value == len(at.selectbox(key="qk_query").options) - 1  # the last token
    key_box = at.selectbox(key="qk_key").proto  # "the one it attends to most" shown, not an empty "Choose an option"
    assert key_box.HasField("default") and key_box.default == 0
    _through_app(at).sidebar.selectbox(key="sel_layer").set_value(2).run()  # the user picks a head
    assert_page_ok(at, TITLE)
    assert _sidebar_focus(at) == (2, head) and _opened_caption(at) is None
    at.switch_page("pages/home.py")
    _through_app(at).run()
    _through_app(at).switch_page(PAGE).run()  # back again: the user's head, not the page's
    assert_page_ok(at, TITLE)
    assert _sidebar_focus(at) == (2, head) and _opened_caption(at) is None


def test_the_opening_head_reads_a_word_from_the_last_word_in_the_later_half(bert_pair_trace):
    from model_core.analysis import trace_flags
    from ui.qk import opening_head

    t = bert_pair_trace
    opening = opening_head(t)
    flags = trace_flags(t)
    assert opening.layer >= t.n_layers // 2
    assert not (flags["special"] | flags["punct"])[opening.query]  # the last word, not [SEP]
    assert not (flags["special"] | flags["punct"])[opening.key] and opening.key != opening.query
    assert opening.weight == pytest.approx(float(t.weights[opening.layer, opening.head, opening.query, opening.key]))
    later = np.asarray(t.weights[t.n_layers // 2:, :, opening.query])  # (layer, head, k_pos)
    words = ~(flags["special"] | flags["punct"]) & (np.arange(t.n_tokens) != opening.query)
    reads_a_word = words[later.argmax(-1)]  # heads whose top key is a word
    assert reads_a_word.any() and opening.top  # the default pair has such heads: the page keeps "its top key"
    assert opening.weight == pytest.approx(float(later.max(-1)[reads_a_word].max()))  # the largest of them


def test_a_long_inputs_compact_trace_opens_where_its_full_trace_does(tiny_decoders):
    from model_core import TraceRequest, build_trace
    from model_core.compact.build import build_compact
    from ui.qk import opening_head

    request = TraceRequest("pretrained", "Time flies like an arrow, and fruit flies like a banana near the river bank.",
                           model_id=str(tiny_decoders["llama"]))
    full, compact = opening_head(build_trace(request, device="cpu")), opening_head(build_compact(request, device="cpu"))
    assert (compact.layer, compact.head, compact.query, compact.key) == (full.layer, full.head, full.query, full.key)
    assert compact.weight == pytest.approx(full.weight, abs=1e-5)
