"""The Contributions page through Streamlit's AppTest: a decoder (graph, head maps, promoted tokens) and an encoder
(any token, no unembedding), with the page state from the link."""

from __future__ import annotations

import json

from app_runs import open_page
from streamlit.testing.v1 import AppTest

PAGE = "pages/contributions.py"


def _open(query: dict, state: dict | None = None) -> AppTest:
    at = open_page(PAGE, query, state)
    assert not at.error, [e.value for e in at.error]
    assert "Contributions: which attention matters" in [t.value for t in at.title]
    return at


def _titles(at: AppTest) -> list[str]:
    return [json.loads(c.proto.spec).get("layout", {}).get("title", {}).get("text", "") for c in at.get("plotly_chart")]


def test_decoder_page_draws_the_graph_head_maps_and_promoted_tokens(tiny_decoders):
    at = _open({"model": "pretrained", "model_id": str(tiny_decoders["llama"]), "a": "time flies like an arrow"},
               {"pg_graph_layer": 1, "pg_graph_threshold": 0.02})
    titles = _titles(at)
    assert any(t.startswith("Contribution graph of") for t in titles), titles
    assert any(t.startswith("Layer 1: each head's contribution") for t in titles), titles
    assert len(at.dataframe) == 2  # the attention and MLP blocks' tokens
    assert {b.label for b in at.main.get("download_button")} >= {
        "Graph (JSON)", "Edges (CSV)", "Head maps (CSV: contribution and attention)", "Attention block tokens (CSV)",
        "MLP block tokens (CSV)"}
    assert any("within the head" in c.value for c in at.caption)  # the caption says how each map is normalised


def test_the_row_picker_reads_its_state_from_the_link(tiny_decoders):
    query = {"model": "pretrained", "model_id": str(tiny_decoders["llama"]), "a": "time flies like an arrow",
             "graph_layer": "0", "graph_threshold": "0.02"}
    at = _open(query)
    picker = at.selectbox(key="pg_graph_row")
    rows = [int(o.split(":")[0]) for o in picker.options]  # the graph's rows at layer 0
    assert len(rows) > 1 and picker.value == rows[-1]  # by default the start token (the last)
    at = _open(query | {"graph_row": str(rows[0])})
    assert at.selectbox(key="pg_graph_row").value == rows[0]


def test_encoder_page_starts_from_any_token_and_says_why_no_tokens(bundled):
    at = _open({"model": "pretrained", "a": "The bank of the river."}, {"pg_graph_token": 2, "pg_graph_layer": 5})
    titles = _titles(at)
    assert any("(position 2)" in t for t in titles), titles
    assert any("no unembedding" in i.value for i in at.main.get("info"))


def test_a_threshold_from_a_link_out_of_range_is_brought_back(tiny_decoders):
    at = _open({"model": "pretrained", "model_id": str(tiny_decoders["gpt2"]), "a": "time flies like an arrow"},
               {"pg_graph_threshold": 0.999})
    assert at.session_state["pg_graph_threshold"] == 0.04
    at = _open({"model": "pretrained", "model_id": str(tiny_decoders["gpt2"]), "a": "time flies like an arrow"},
               {"pg_graph_threshold": 0.0})  # below 0.01 every share passes: the whole model
    assert at.session_state["pg_graph_threshold"] == 0.04


LONG = ("The river rose in the night. The valley waited for the morning!\nChildren counted the stones on the bank. "
        "Herons stood in the shallows below the weir.\n")


def test_a_long_input_draws_its_graph_from_the_compact_trace(monkeypatch, tiny_decoders):
    monkeypatch.setenv("AE_FULL_TRACE_MB", "0.2")  # a tiny decoder's text of about 80 tokens is traced compact
    at = _open({"model": "pretrained", "model_id": str(tiny_decoders["llama"]), "a": LONG}, {"pg_graph_layer": 0})
    ctx = at.session_state["_app_context"]
    assert ctx.trace is None and ctx.compact is not None
    assert "compact trace" in at.caption[0].value
    titles = _titles(at)
    assert any(t.startswith("Contribution graph of") for t in titles), titles
