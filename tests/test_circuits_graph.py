"""The circuits graph: its node names and order, its edges (123,211 for SmolLM2), a circuit as the top edges with
ties to the earlier sender then receiver, faithfulness and its areas against hand-computed values, and the result's
JSON, CSV and circuit JSON."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from model_core.circuits.faithfulness import (
    FRACTIONS,
    cmd,
    cmd_log,
    cpr,
    cpr_log,
    faithfulness,
)
from model_core.circuits.graph import EdgeScores, Graph, edge_budget
from model_core.circuits.result import CircuitResult, FaithfulnessCurve


def _edges_by_definition(n_layers: int, n_heads: int, parallel: bool) -> set[tuple[str, str]]:
    """Every edge, written from the issue's definition with no shortcut."""
    def senders_before(layer: int) -> list[str]:
        out = ["input"]
        for earlier in range(layer):
            out += [f"a{earlier}.h{h}" for h in range(n_heads)] + [f"m{earlier}"]
        return out

    edges = set()
    for layer in range(n_layers):
        for head in range(n_heads):
            for part in "qkv":
                edges |= {(u, f"a{layer}.h{head}<{part}>") for u in senders_before(layer)}
        own = [] if parallel else [f"a{layer}.h{h}" for h in range(n_heads)]
        edges |= {(u, f"m{layer}") for u in senders_before(layer) + own}
    edges |= {(u, "logits") for u in senders_before(n_layers)}
    return edges


def test_smollm2_has_123211_edges():
    graph = Graph(30, 9)
    assert graph.n_edges == 123_211 == int(graph.mask.sum())
    assert graph.shape == (1 + 30 * 10, 30 * 28 + 1)


@pytest.mark.parametrize("n_layers, n_heads, parallel", [(1, 1, False), (2, 3, False), (3, 2, True), (4, 4, False)])
def test_the_edges_are_the_definitions(n_layers, n_heads, parallel):
    graph = Graph(n_layers, n_heads, parallel=parallel)
    senders, receivers = graph.edges()
    found = {(graph.senders[s], graph.receivers[r]) for s, r in zip(senders, receivers)}
    assert found == _edges_by_definition(n_layers, n_heads, parallel)
    assert graph.n_edges == len(found)


def test_the_node_names_and_their_order():
    graph = Graph(2, 2)
    assert graph.senders == ("input", "a0.h0", "a0.h1", "m0", "a1.h0", "a1.h1", "m1")
    assert graph.receivers == ("a0.h0<q>", "a0.h0<k>", "a0.h0<v>", "a0.h1<q>", "a0.h1<k>", "a0.h1<v>", "m0",
                               "a1.h0<q>", "a1.h0<k>", "a1.h0<v>", "a1.h1<q>", "a1.h1<k>", "a1.h1<v>", "m1", "logits")
    assert graph.head_sender(1, 1) == graph.sender_index("a1.h1") and graph.mlp_sender(0) == 3
    assert graph.head_receiver(1, 0, "k") == graph.receiver_index("a1.h0<k>")
    assert graph.mlp_receiver(1) == 13 and graph.logits_receiver == 14
    with pytest.raises(ValueError, match="No sender 'a9.h0'"):
        graph.sender_index("a9.h0")


def test_a_parallel_block_has_no_head_to_mlp_edge_within_a_layer():
    serial, parallel = Graph(2, 3), Graph(2, 3, parallel=True)
    assert serial.mask[serial.sender_index("a1.h2"), serial.receiver_index("m1")]
    assert not parallel.mask[parallel.sender_index("a1.h2"), parallel.receiver_index("m1")]
    assert serial.n_edges - parallel.n_edges == 2 * 3


def test_a_graph_needs_layers_and_heads():
    with pytest.raises(ValueError, match="n_heads ≥ 1"):
        Graph(2, 0)


def _scores(graph: Graph, values: dict[tuple[str, str], float]) -> EdgeScores:
    matrix = np.zeros(graph.shape)
    for (s, r), v in values.items():
        matrix[graph.sender_index(s), graph.receiver_index(r)] = v
    return EdgeScores(graph, matrix)


def test_a_circuit_takes_the_largest_abs_scores_ties_to_the_earlier_sender_then_receiver():
    graph = Graph(2, 2)
    scores = _scores(graph, {("a0.h1", "logits"): 2.0, ("input", "logits"): -2.0, ("input", "m0"): 2.0,
                             ("a1.h0", "logits"): -5.0, ("m0", "a1.h0<q>"): 1.0})
    top = scores.top(4)
    assert top == [("a1.h0", "logits", -5.0), ("input", "m0", 2.0), ("input", "logits", -2.0),
                   ("a0.h1", "logits", 2.0)]
    mask = scores.circuit_of_size(3)
    assert mask.sum() == 3 and not mask[graph.sender_index("a0.h1"), graph.logits_receiver]


def test_zero_scores_tie_in_edge_order():
    graph = Graph(1, 1)
    order = EdgeScores(graph, np.zeros(graph.shape)).top()
    assert [(s, r) for s, r, _ in order] == [("input", "a0.h0<q>"), ("input", "a0.h0<k>"), ("input", "a0.h0<v>"),
                                              ("input", "m0"), ("input", "logits"), ("a0.h0", "m0"),
                                              ("a0.h0", "logits"), ("m0", "logits")]


def test_the_budget_is_the_ceiling_of_f_times_e():
    assert edge_budget(0.001, 123_211) == 124  # 123.211 up
    assert [edge_budget(f, 1000) for f in FRACTIONS] == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    assert edge_budget(0.0, 50) == 0 and edge_budget(1.0, 50) == 50
    assert Graph(30, 9).n_edges and EdgeScores(Graph(1, 1), np.ones((3, 5))).circuit(0.5).sum() == 4  # ⌈0.5·8⌉
    with pytest.raises(ValueError, match="between 0 and 1"):
        edge_budget(1.5, 10)


def test_scores_off_the_edges_are_zero_and_nan_on_an_edge_is_refused():
    graph = Graph(1, 1)
    scores = EdgeScores(graph, np.ones(graph.shape))
    assert scores.matrix[~graph.mask].sum() == 0 and scores.values().size == graph.n_edges
    bad = np.zeros(graph.shape)
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        EdgeScores(graph, bad)
    with pytest.raises(ValueError, match="shape"):
        EdgeScores(graph, np.zeros((3, 3)))


def test_faithfulness_is_one_with_every_edge_and_zero_with_none():
    m_clean, m_corrupt = 3.25, -1.5
    assert faithfulness(m_clean, m_clean, m_corrupt) == 1.0
    assert faithfulness(m_corrupt, m_clean, m_corrupt) == 0.0
    assert faithfulness(0.875, m_clean, m_corrupt) == pytest.approx((0.875 + 1.5) / 4.75)
    np.testing.assert_allclose(faithfulness(np.array([m_corrupt, m_clean]), m_clean, m_corrupt), [0.0, 1.0])
    with pytest.raises(ValueError, match="equal"):
        faithfulness(1.0, 2.0, 2.0)


def test_cpr_and_cmd_against_hand_computed_areas():
    ones, zeros = [1.0] * 10, [0.0] * 10
    assert cpr(ones) == pytest.approx(0.999) and cmd(ones) == 0.0
    assert cpr(zeros) == 0.0 and cmd(zeros) == pytest.approx(0.999)
    half_then_one = [0.0] * 8 + [0.5, 1.0]
    # 0.2 -> 0.5: 0.3 * (0 + 0.5) / 2 = 0.075; 0.5 -> 1: 0.5 * (0.5 + 1) / 2 = 0.375
    assert cpr(half_then_one) == pytest.approx(0.45)
    # |1 - F|: 1 from 0.001 to 0.2 (0.199), then 0.3 * 1.5 / 2 = 0.225, then 0.5 * 0.5 / 2 = 0.125
    assert cmd(half_then_one) == pytest.approx(0.549)
    assert cmd([2.0] * 10) == pytest.approx(0.999)  # above 1 counts as far from 1 as below it
    assert cpr([1.0, 0.0], [0.5, 1.0]) == pytest.approx(0.25)


def test_the_log_axis_variant_is_named_apart():
    assert cpr_log([1.0] * 10) == pytest.approx(math.log(1000))
    assert cmd_log([1.0] * 10) == 0.0
    assert cpr_log([1.0] * 10) != cpr([1.0] * 10)


def test_a_curve_needs_increasing_fractions_and_one_value_each():
    with pytest.raises(ValueError, match="increasing"):
        cpr([1, 1], [0.5, 0.1])
    with pytest.raises(ValueError, match="one faithfulness a fraction"):
        cmd([1, 1, 1], [0.1, 0.2])


def _result(curve: FaithfulnessCurve | None = None) -> CircuitResult:
    graph = Graph(2, 2)
    rng = np.random.default_rng(0)
    return CircuitResult(n=4, clean=2.0000000000000004, corrupt=-1.1, method="eap-ig", steps=5,
                         scores=EdgeScores(graph, rng.normal(size=graph.shape) / 3), curve=curve)


def test_the_json_has_exactly_the_issues_keys_at_full_precision():
    values = [0.1 / 3, 0.2, 0.25, 0.3, 0.31, 0.5, 0.7, 0.9, 1.0000000000000002, 1.0]
    result = _result(FaithfulnessCurve(FRACTIONS, values))
    out = json.loads(json.dumps(result.to_json()))
    assert set(out) == {"n", "clean", "corrupt", "method", "steps", "edges", "faithfulness"}
    assert out["clean"] == 2.0000000000000004 and out["n"] == 4 and out["steps"] == 5
    assert len(out["edges"]) == result.scores.graph.n_edges
    assert out["edges"][0] == ["input", "a0.h0<q>", float(result.scores.matrix[0, 0])]  # every edge, full precision
    faith = out["faithfulness"]
    assert faith["fractions"] == list(FRACTIONS) and faith["faithfulness"] == values
    assert faith["cpr"] == cpr(faith["faithfulness"], faith["fractions"])  # from the printed values
    assert faith["cmd"] == cmd(faith["faithfulness"], faith["fractions"])


def test_the_json_top_k_is_by_abs_score():
    out = _result().to_json(top=5)
    assert len(out["edges"]) == 5 and out["faithfulness"] is None
    magnitudes = [abs(e[2]) for e in out["edges"]]
    assert magnitudes == sorted(magnitudes, reverse=True)
    assert magnitudes[0] == np.abs(_result().scores.values()).max()


def test_the_csv_holds_every_edge_and_the_circuit_json_its_budget():
    result = _result(FaithfulnessCurve(FRACTIONS, [0.5] * 10))
    lines = result.edges_csv().splitlines()
    assert lines[0] == "sender,receiver,score,abs_score,rank" and len(lines) == 1 + result.scores.graph.n_edges
    sender, receiver, score, _, _ = lines[1].split(",")
    assert (sender, receiver, float(score)) == ("input", "a0.h0<q>", float(result.scores.matrix[0, 0]))
    circuit = result.circuit_json(0.1)
    assert circuit["kept"] == math.ceil(0.1 * 46) == len(circuit["edges"]) and circuit["faithfulness"] == 0.5
    assert circuit["edges"] == [list(e) for e in result.scores.top(5)]
    assert set(circuit["nodes"]) == {n for s, r, _ in circuit["edges"] for n in (s, r)}


def test_a_result_checks_its_method_and_steps():
    graph = Graph(1, 1)
    with pytest.raises(ValueError, match="eap, eap-ig"):
        CircuitResult(1, 1.0, 0.0, "acdc", 1, EdgeScores(graph, np.zeros(graph.shape)))
    with pytest.raises(ValueError, match="steps"):
        CircuitResult(1, 1.0, 0.0, "eap", 0, EdgeScores(graph, np.zeros(graph.shape)))
