"""Every analysis on the real bundled BERT (and the custom encoder) for the default sentence pair."""

import networkx as nx
import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon

from model_core import TraceRequest, build_trace, load_pretrained
from model_core.analysis import (
    attention_flow,
    attention_rollout,
    compare_contexts,
    compare_masking,
    find_occurrences,
    head_mask_from_off,
    head_stats,
    mixed_attention,
    norm_weighted_attention,
    special_token_mass,
)
from model_core.analysis.contexts import bin_assignment

pytestmark = pytest.mark.slow

A, B = "time flies like an arrow", "fruit flies like a banana"


@pytest.fixture(scope="module")
def bert(bert_pair_trace):
    assert bert_pair_trace.tokens[2] == bert_pair_trace.tokens[8] == "flies"  # the default pair
    return bert_pair_trace


def test_contexts_of_flies_match_a_naive_recomputation(bert):
    first, second = find_occurrences(bert, "flies")
    assert (first.start, first.sentence, second.start, second.sentence) == (2, "a", 8, "b")
    result = compare_contexts(bert, first, second)
    for span, dist in ((first, result.dist_first), (second, result.dist_second)):
        bins = bin_assignment(bert, span, "categories")
        for layer, head in [(0, 0), (3, 7), (5, 11)]:
            expected = np.bincount(bins, weights=bert.weights[layer, head, span.start], minlength=7)
            np.testing.assert_allclose(dist[layer, head], expected, atol=1e-6)
    for layer, head in [(0, 0), (3, 7), (5, 11)]:
        ref = jensenshannon(result.dist_first[layer, head], result.dist_second[layer, head], base=2) ** 2
        assert result.js[layer, head] == pytest.approx(ref, abs=1e-6)
    h = bert.hidden_states.astype(np.float64)
    cos = [h[i, 2] @ h[i, 8] / np.linalg.norm(h[i, 2]) / np.linalg.norm(h[i, 8]) for i in range(7)]
    np.testing.assert_allclose(result.hidden_cosine, cos, atol=1e-6)
    # Same token id, different position and segment: close but not identical even as embeddings.
    assert 0.5 < result.hidden_cosine[0] < 0.999


def test_flow_on_real_bert_matches_networkx_and_rollout_rows_sum_to_one(bert):
    mixed = mixed_attention(bert.weights)
    graph = nx.DiGraph()
    n_layers, n, _ = mixed.shape
    for layer in range(n_layers):
        for i in range(n):
            for j in range(n):
                graph.add_edge((layer, j), (layer + 1, i), capacity=float(mixed[layer, i, j]))
    flow = attention_flow(bert.weights)
    for i, j in [(0, 0), (0, 2), (0, 12), (5, 8), (12, 1)]:
        assert flow[i, j] == pytest.approx(nx.maximum_flow_value(graph, (0, j), (n_layers, i)), abs=1e-4)
    rollout = attention_rollout(bert.weights)
    np.testing.assert_allclose(rollout.sum(-1), 1.0, atol=1e-6)
    assert np.argmax(rollout[-1, 0]) == 0  # the residual keeps [CLS] its own largest source


def test_value_norms_are_norms_of_values_through_bert_output_projection(bert):
    model = load_pretrained().model
    d_head = bert.d_head
    for layer in (0, 5):
        w_o = model.encoder.layer[layer].attention.output.dense.weight.detach().numpy().astype(np.float64)
        for head in (0, 11):
            f = bert.values[layer, head].astype(np.float64) @ w_o[:, head * d_head : (head + 1) * d_head].T
            np.testing.assert_allclose(bert.value_norms[layer, head], np.linalg.norm(f, axis=-1), rtol=1e-4)
    weighted = norm_weighted_attention(bert.weights, bert.value_norms)
    assert weighted.shape == bert.weights.shape


def test_bert_attention_to_cls_carries_little(bert):
    # Kobayashi et al.: heavy attention to special tokens goes to small value vectors.
    mass = special_token_mass(bert)
    assert mass.raw_cls.mean() > 0.3
    assert mass.norm_cls.mean() < 0.5 * mass.raw_cls.mean()


def test_bert_has_a_previous_token_head_and_stats_match_a_loop(bert):
    stats = head_stats(bert)
    assert stats.to_prev.max() > 0.8  # Clark et al. found heads that attend to the previous token
    a = bert.weights[2, 3].astype(np.float64)
    assert stats.to_prev[2, 3] == pytest.approx(np.mean([a[i, i - 1] for i in range(1, 13)]), abs=1e-6)
    assert stats.a_to_b[2, 3] == pytest.approx(np.mean([a[i, 7:12].sum() for i in range(1, 6)]), abs=1e-6)


def test_masking_a_bert_head_changes_only_later_layers(bert):
    masked = build_trace(TraceRequest(model="bert", text_a=A, text_b=B, head_mask=head_mask_from_off(6, 12, [(2, 4)])))
    effect = compare_masking(bert, masked)
    assert effect.first_masked_layer == 2 and np.isnan(effect.attention_tv[2, 4])
    np.testing.assert_allclose(np.nan_to_num(effect.attention_tv[:3]), 0.0, atol=1e-5)
    np.testing.assert_allclose(effect.cls_cosine[:3], 1.0, atol=1e-6)  # embeddings, layers 0 and 1
    assert effect.cls_l2[3] > 1e-3 and np.nanmean(effect.attention_tv[3:]) > 1e-4
    assert effect.logits_delta is None


def test_masking_custom_encoder_heads_moves_its_logits():
    kwargs = dict(model="custom", text_a=A, text_b=B, seed=0)
    base = build_trace(TraceRequest(**kwargs))
    off = head_mask_from_off(base.n_layers, base.n_heads, [(0, h) for h in range(base.n_heads)])
    effect = compare_masking(base, build_trace(TraceRequest(**kwargs, head_mask=off)))
    assert effect.logits_baseline is not None and np.abs(effect.logits_delta).max() > 1e-4
    assert effect.cls_l2[1] > 1e-3
