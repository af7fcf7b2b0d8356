"""Attention rollout and flow against naive loops, networkx max-flow and hand-worked examples."""

import networkx as nx
import numpy as np
import pytest

from model_core.analysis import rollout as ro
from model_core.analysis.rollout import (
    FLOW_MAX_TOKENS,
    attention_flow,
    attention_rollout,
    check_flow_size,
)

mixed_attention, normalize_rows, rollout_and_flow = ro.mixed_attention, ro.normalize_rows, ro.rollout_and_flow
from synthetic import synthetic_trace


def _random_attentions(n_layers, n_heads, n, seed):
    rng = np.random.default_rng(seed)
    a = rng.random((n_layers, n_heads, n, n)) ** 3
    return a / a.sum(-1, keepdims=True)


def test_mixed_attention_matches_naive_formula():
    att = _random_attentions(2, 3, 4, seed=0)
    mixed = mixed_attention(att)
    for layer in range(2):
        mean = sum(att[layer, h] for h in range(3)) / 3
        ref = 0.5 * np.eye(4) + 0.5 * mean
        ref = ref / ref.sum(1, keepdims=True)
        np.testing.assert_allclose(mixed[layer], ref, atol=1e-12)


def test_rollout_matches_naive_triple_loop_and_rows_sum_to_one():
    att = _random_attentions(3, 2, 5, seed=1)
    mixed = mixed_attention(att)
    rollout = attention_rollout(att)
    current = np.eye(5)
    for layer in range(3):
        nxt = np.zeros((5, 5))
        for i in range(5):
            for j in range(5):
                for k in range(5):
                    nxt[i, j] += mixed[layer, i, k] * current[k, j]
        current = nxt
        np.testing.assert_allclose(rollout[layer], current, atol=1e-12)
    np.testing.assert_allclose(rollout.sum(-1), 1.0, atol=1e-12)


def test_rollout_hand_worked_swap():
    # One head that swaps two tokens: Ã = 0.5 I + 0.5 [[0,1],[1,0]] = all 0.5.
    att = np.array([[[[0.0, 1.0], [1.0, 0.0]]]])
    np.testing.assert_allclose(attention_rollout(att)[0], [[0.5, 0.5], [0.5, 0.5]])


def test_masked_heads_leave_the_average_and_an_all_off_layer_is_identity():
    att = _random_attentions(2, 2, 3, seed=2)
    mask = np.array([[True, False], [False, False]])
    mixed = mixed_attention(att, mask)
    ref = 0.5 * np.eye(3) + 0.5 * att[0, 0]
    np.testing.assert_allclose(mixed[0], ref / ref.sum(1, keepdims=True), atol=1e-12)
    np.testing.assert_allclose(mixed[1], np.eye(3), atol=1e-12)


def _networkx_flow(mixed):
    n_layers, n, _ = mixed.shape
    graph = nx.DiGraph()
    for layer in range(n_layers):
        for i in range(n):
            for j in range(n):
                graph.add_edge((layer, j), (layer + 1, i), capacity=float(mixed[layer, i, j]))
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            out[i, j] = nx.maximum_flow_value(graph, (0, j), (n_layers, i))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_flow_matches_networkx_max_flow_on_small_graphs(seed):
    att = _random_attentions(3, 2, 4, seed=seed)
    expected = _networkx_flow(mixed_attention(att))
    np.testing.assert_allclose(attention_flow(att), expected, atol=1e-5)


def test_flow_matches_networkx_on_a_causal_trace():
    trace = synthetic_trace(6, 2, 2, seed=3, causal=True)
    expected = _networkx_flow(mixed_attention(trace.weights))
    np.testing.assert_allclose(attention_flow(trace.weights), expected, atol=1e-5)


def test_flow_hand_worked_two_layers():
    # residual 0 so Ã = A. With two layers every path input j -> middle k -> output i is
    # edge-disjoint, so flow(i, j) = sum_k min(A0[k, j], A1[i, k]).
    a0 = np.array([[1.0, 0.0], [0.25, 0.75]])
    a1 = np.array([[0.5, 0.5], [0.0, 1.0]])
    att = np.stack([a0[None], a1[None]])
    flow = attention_flow(att, residual=0.0)
    np.testing.assert_allclose(flow, [[0.75, 0.5], [0.25, 0.75]], atol=1e-5)
    # Rollout differs: A1 @ A0 = [[0.625, 0.375], [0.25, 0.75]].
    np.testing.assert_allclose(attention_rollout(att, residual=0.0)[-1], [[0.625, 0.375], [0.25, 0.75]])


def test_flow_two_layer_closed_form_on_random_matrices():
    att = _random_attentions(2, 1, 6, seed=7)
    mixed = mixed_attention(att)
    expected = np.minimum(mixed[0].T[:, None, :], mixed[1][None, :, :]).sum(-1).T  # (i, j)
    np.testing.assert_allclose(attention_flow(att), expected, atol=2e-5)


def test_one_flow_row_equals_that_row_of_the_full_matrix():
    att = _random_attentions(2, 2, 5, seed=4)
    row = attention_flow(att, rows=[0])
    np.testing.assert_allclose(row[0], attention_flow(att)[0])
    assert np.isnan(row[1:]).all()


def test_flow_refuses_inputs_past_the_limit_and_says_what_to_do():
    with pytest.raises(ValueError, match=rf"limited to {FLOW_MAX_TOKENS} tokens.*rollout"):
        check_flow_size(FLOW_MAX_TOKENS + 1)
    check_flow_size(FLOW_MAX_TOKENS)
    att = _random_attentions(1, 1, FLOW_MAX_TOKENS + 1, seed=0)
    with pytest.raises(ValueError, match="Shorten the text"):
        attention_flow(att)


def test_rollout_and_flow_skips_flow_past_the_limit_but_keeps_the_cls_row():
    att = _random_attentions(1, 1, FLOW_MAX_TOKENS + 2, seed=0)
    result = rollout_and_flow(att)
    assert result.flow is None
    assert result.cls_flow is not None and result.cls_flow.shape == (FLOW_MAX_TOKENS + 2,)
    assert result.cls_rollout.sum() == pytest.approx(1.0)


def test_normalize_rows_keeps_nan_rows():
    m = np.array([[1.0, 3.0], [np.nan, np.nan]])
    out = normalize_rows(m)
    np.testing.assert_allclose(out[0], [0.25, 0.75])
    assert np.isnan(out[1]).all()
