"""AppTest of the Head roles page: grids, top heads with links, a click opens the heatmaps on the probe input."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PAGE = "pages/head_roles.py"


def _open(**query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    for name, value in query.items():
        at.query_params[name] = value
    at.run()
    at.switch_page(PAGE).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert [h.value for h in at.header] == ["Head roles"]
    return at


def _links(at: AppTest) -> list[dict]:
    frame = at.dataframe[0].value
    return [parse_qs(urlparse(url).query, keep_blank_values=True) | {"path": [urlparse(url).path]}
            for url in frame["open"]]


@pytest.mark.slow
def test_roles_page_on_bert_says_why_an_encoder_has_no_retrieval_and_links_the_probe():
    at = _open()
    assert len(at.get("plotly_chart")) == 1
    assert any("encoder generates nothing" in i.value for i in at.info)
    frame = at.dataframe[0].value
    assert len(frame) == 10 and frame["score"].is_monotonic_decreasing
    link = _links(at)[0]
    assert link["path"] == ["heatmaps"] and link["model"] == ["pretrained"]
    assert int(link["layer"][0]) == frame["layer"][0] and int(link["head"][0]) == frame["head"][0]
    assert link["text_b"] == [""]  # the probe input has no sentence B
    words = link["text_a"][0].split()
    assert len(words) == 100 and words[:50] == words[50:]  # the probe's own input: 50 words, twice
    assert len(at.get("download_button")) == 2
    opened = AppTest.from_file(APP, default_timeout=300)  # the link, as a new tab opens it
    for name, values in link.items():
        if name != "path":
            opened.query_params[name] = values[0]
    opened.run()
    assert not opened.exception, [e.value for e in opened.exception]
    ctx = opened.session_state["_app_context"]
    assert ctx.trace.tokens[1:-1] == tuple(words) and (ctx.layer, ctx.head) == (frame["layer"][0], frame["head"][0])


@pytest.mark.slow
def test_roles_page_button_opens_the_heatmaps_on_the_probe_input_with_the_head_in_focus():
    at = _open(model="custom", layers="2", heads="4", hidden="64")
    assert not [s.label for s in at.main.selectbox]  # the sidebar's picker is the page's only one
    at.sidebar.selectbox(key="sel_layer").set_value(1).run()
    at.sidebar.selectbox(key="sel_head").set_value(3).run()
    assert at.button(key="roles_open").label == "Open layer 1, head 3 on the probe input"
    probe = at.session_state["roles_seed"]
    at.button(key="roles_open").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert [t.value for t in at.title] == ["Attention heatmaps"]
    assert (at.session_state["sel_layer"], at.session_state["sel_head"]) == (1, 3)
    text = at.session_state["ctl_text_a"].split()
    assert len(text) == 100 and text[:50] == text[50:] and probe == 0
    assert at.session_state["ctl_text_b"] == ""


@pytest.mark.slow
def test_roles_page_scores_the_sidebar_text_and_a_decoders_retrieval(tiny_decoders):
    at = _open(model="pretrained", model_id=str(tiny_decoders["llama"]), a="the cat sat on the mat the cat sat")
    at.toggle(key="roles_text").set_value(True).run()
    at.radio(key="roles_text_role").set_value("duplicate_token").run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.get("plotly_chart")) == 2
    at.toggle(key="roles_retrieval").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("Password" in c.value for c in at.caption)
    assert len(at.get("plotly_chart")) == 3 and len(at.dataframe) == 2


@pytest.mark.slow
def test_corpus_page_colours_its_heads_by_role_score_beside_the_pattern_types(tmp_path, monkeypatch):
    monkeypatch.setenv("AE_CORPUS_DIR", str(tmp_path / "runs"))
    at = AppTest.from_file(APP, default_timeout=300)
    at.switch_page("pages/corpus.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.get("plotly_chart")) == 2  # the pattern types by default: no probe is run
    at.radio(key="corpus_colour").set_value("induction")
    del at.session_state["_app_context"]  # a full run through app.py (AppTest runs a page alone after its first)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    charts = at.get("plotly_chart")
    assert len(charts) == 2 and "Induction score" in charts[1].proto.spec
    table = at.dataframe[0].value
    assert set(table["pattern"]) <= {"vertical", "diagonal", "block", "heterogeneous"}
    assert table["heads"].sum() == 6 * 12  # every MiniLM head in one pattern type
