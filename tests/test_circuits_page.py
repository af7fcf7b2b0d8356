"""The Circuits page (AppTest): a run on SmolLM2 over generated IOI pairs draws the circuit, the faithfulness curve
with CPR and CMD, the nodes with links to their heatmaps and the downloads; a stopped run is shown as partial; pairs
that cannot run are listed; an encoder gets a message."""

from __future__ import annotations

import json

import pytest
from streamlit.testing.v1 import AppTest
from tiny_models import build_tiny_decoder

from harness.apptest import open_page

PAGE = "pages/circuits.py"
SMOL = "bundled:SmolLM2-135M-Instruct"


def _open(model_id: str | None, **state) -> AppTest:
    """app.py on ``model_id``, then the Circuits page, with ``state`` set first."""
    return open_page(PAGE, "Circuits", model_id=model_id, state=state, timeout_s=600)


def _titles(at: AppTest) -> list[str]:
    return [json.loads(c.proto.spec).get("layout", {}).get("title", {}).get("text", "") for c in at.get("plotly_chart")]


@pytest.mark.slow
def test_a_run_draws_the_circuit_its_curve_and_its_nodes():
    at = _open(SMOL, circ_count=2, circ_method="eap")
    assert not at.error, [e.value for e in at.error]
    assert _titles(at) == []  # nothing runs before the button
    at.button(key="circ_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    titles = _titles(at)
    assert any(t.startswith("The circuit at 0.01 of the edges: 1233 edges") for t in titles), titles
    assert any(t.startswith("Faithfulness: CPR") and "linear axis" in t for t in titles), titles
    labels = [m.label for m in at.metric]
    assert {"Pairs run", "CPR (linear axis)", "CMD (linear axis)", "CPR (log axis)"} <= set(labels)
    assert at.metric[0].value == "2"
    table = at.dataframe[0].value
    heads = table[table["node"].str.startswith("a")]
    assert len(heads) and heads["open"].str.startswith("heatmaps?").all()
    assert heads["open"].str.contains("layer=").all() and heads["open"].str.contains("text_a=").all()
    assert (table["sum_abs_score"].diff().dropna() <= 0).all()  # largest first
    at.select_slider(key="circ_fraction").set_value(0.1).run()
    assert any(t.startswith("The circuit at 0.1 of the edges: 2000 of 12322 edges") for t in _titles(at))


def test_pairs_that_cannot_run_are_listed(tmp_path):
    llama = build_tiny_decoder("llama", tmp_path / "llama")  # its tokenizer splits the generators' names
    at = _open(str(llama), circ_count=3)
    assert any("No pair of ioi:3:0 can run" in e.value for e in at.error)
    assert any("pair 1 (row 1)" in c.value and "tokens" in c.value for c in at.code)


def test_an_encoder_gets_a_message():
    at = _open(None)
    assert any("predicts no next token" in i.value for i in at.info), [i.value for i in at.info]
