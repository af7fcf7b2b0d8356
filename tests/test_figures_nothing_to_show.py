"""Figures with nothing to show say so: a circuit whose scores are all 0 (clean and corrupted prompts alike), an empty
or NaN faithfulness curve, nodes with no weight. No NaN reaches a scatter's or a bar's numbers (Plotly refuses a NaN
marker size: the Circuits page's ValueError), and each such figure carries a message instead of an empty plot."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import pytest

from attention_explorer.circuits import (
    Circuit,
    circuit_graph_figure,
    faithfulness_figure,
    node_totals_figure,
    nothing_to_show,
)
from model_core.circuits.graph import EdgeScores, Graph
from model_core.circuits.result import CircuitResult, FaithfulnessCurve

GRAPH = Graph(2, 3)
NUMERIC = ("x", "y", "z", "customdata")


def _numbers(value) -> list[float]:
    """Every number in a trace property (nested lists and arrays), None left out."""
    if value is None or isinstance(value, str):
        return []
    if isinstance(value, (int, float, np.number)):
        return [float(value)]
    if isinstance(value, (list, tuple, np.ndarray)):
        return [n for v in value for n in _numbers(v)]
    return []


def nan_in(fig: go.Figure) -> list[str]:
    """The trace properties of ``fig`` that hold a NaN (x, y, z, customdata, marker size and colour)."""
    found = []
    for i, trace in enumerate(fig.data):
        props = {name: getattr(trace, name, None) for name in NUMERIC}
        marker = getattr(trace, "marker", None)
        if marker is not None:
            props["marker.size"], props["marker.color"] = marker.size, marker.color
        found += [f"trace {i} {name}" for name, value in props.items() if any(math.isnan(n) for n in _numbers(value))]
    return found


def message_of(fig: go.Figure) -> str:
    return " ".join(a.text for a in fig.layout.annotations)


def _scores(matrix: np.ndarray) -> EdgeScores:
    return EdgeScores(GRAPH, np.where(GRAPH.mask, matrix, 0.0))


def test_a_circuit_whose_scores_are_all_zero_says_so():
    fig = circuit_graph_figure(_scores(np.zeros(GRAPH.shape)), 0.1)
    assert not nan_in(fig) and not fig.data
    assert "Every edge scores 0" in message_of(fig) and "corrupted prompt" in message_of(fig)


def test_a_circuit_with_one_scored_edge_draws_finite_sizes():
    matrix = np.zeros(GRAPH.shape)
    matrix[0, 0] = 0.5  # input -> a0.h0<q>
    fig = circuit_graph_figure(_scores(matrix), 1.0)
    assert not nan_in(fig), nan_in(fig)
    sizes = [s for t in fig.data if t.mode == "markers+text" for s in t.marker.size]
    assert sizes and all(np.isfinite(sizes)) and not fig.layout.annotations


@pytest.mark.parametrize("values", [[float("nan")] * 3, []], ids=["nan", "empty"])
def test_a_curve_with_nothing_finite_says_so(values):
    curve = FaithfulnessCurve(tuple([0.1, 0.5, 1.0][:len(values)]), tuple(values))
    fig = faithfulness_figure(curve)
    assert not nan_in(fig) and not fig.data and "No faithfulness to draw" in message_of(fig)


def test_a_curve_with_a_nan_point_draws_the_others():
    curve = FaithfulnessCurve((0.1, 0.5, 1.0), (0.2, float("nan"), 1.0))
    fig = faithfulness_figure(curve)
    assert not nan_in(fig) and list(fig.data[0].x) == [0.1, 1.0]


def test_nodes_with_no_weight_say_so():
    fig = node_totals_figure(_scores(np.zeros(GRAPH.shape)))
    assert not nan_in(fig) and "nothing to rank" in message_of(fig)


def test_every_figure_of_an_all_zero_run_has_no_nan():
    nan = float("nan")
    result = CircuitResult(4, 1.5, 1.5, "eap", 1, _scores(np.zeros(GRAPH.shape)),
                           FaithfulnessCurve((0.1, 1.0), (nan, nan)), (), False)
    figures = Circuit(result).figures(0.1)
    assert set(figures) == {"graph", "nodes", "faithfulness"}
    for name, fig in figures.items():
        assert not nan_in(fig), (name, nan_in(fig))
        assert message_of(fig), name  # each says why it is empty


def test_the_nan_check_finds_a_nan():
    """The check above can fail (Plotly itself refuses a NaN marker size, the Circuits page's old error)."""
    fig = go.Figure(go.Scatter(x=[0, 1], y=[0, float("nan")], customdata=[[float("nan")], [1.0]]))
    assert nan_in(fig) == ["trace 0 y", "trace 0 customdata"]
    assert message_of(nothing_to_show("empty")) == "empty"
