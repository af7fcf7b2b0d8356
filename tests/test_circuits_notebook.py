"""The notebook's ``circuit``: the edges largest first, the faithfulness curve, and the page's figures."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import attention_explorer as ae
from model_core.circuits.datasets import Dataset
from model_core.circuits.faithfulness import FRACTIONS

sys.path.insert(0, str(Path(__file__).parent))
from test_circuits_eap import TINY_PAIRS


def test_circuit_returns_the_edges_the_curve_and_the_figures(tiny_decoders):
    got = ae.circuit(Dataset.of(TINY_PAIRS), model=str(tiny_decoders["llama"]), method="eap-ig", steps=2)
    assert isinstance(got, ae.Circuit) and got.result.n == 5 and got.result.steps == 2
    scores = [abs(v) for _, _, v in got.edges]
    assert len(scores) == got.result.scores.graph.n_edges and scores == sorted(scores, reverse=True)
    assert got.curve.fractions == FRACTIONS and got.curve.values[-1] == pytest.approx(1.0, abs=1e-5)
    figures = got.figures(0.1)
    assert set(figures) == {"graph", "nodes", "faithfulness"}
    graph = figures["graph"]
    kept = got.result.scores.circuit(0.1).sum()
    assert graph.layout.title.text.startswith(f"The circuit at 0.1 of the edges: {kept} edges")
    hover = next(t for t in graph.data if t.hovertemplate == "%{text}<extra></extra>")
    assert len(hover.text) == kept  # one hover point an edge, the circuit's edges only
    colours = {t.line.color for t in graph.data if t.mode == "lines" and t.x and t.x[0] is not None}
    assert colours <= {"#1f77b4", "#d62728"} and colours
    assert "linear axis" in figures["faithfulness"].layout.title.text
    table = got.table()
    assert len(table) == len(scores) and table["rank"].min() == 1
    assert got.to_json(top=3)["edges"] == [list(e) for e in got.edges[:3]]
