"""Clark et al. (2019) head statistics against naive loops and hand-worked patterns."""

import math

import numpy as np
import pytest

from model_core.analysis.per_head import STAT_NAMES, TRACE_STAT_NAMES, head_stats
from synthetic import synthetic_trace

PUNCT_PAIR = ("[CLS]", "time", "flies", ",", "fast", "[SEP]", "fruit", "flies", ".", "[SEP]")


def _with_attentions(trace, att):
    return type(trace)(**{**trace.__dict__, "weights": np.asarray(att, dtype=np.float32)})


def test_head_stats_match_naive_loops_on_a_pair_with_punctuation():
    trace = synthetic_trace(tokens=PUNCT_PAIR, sentence_b_start=6, n_layers=2, n_heads=3, seed=8)
    stats = head_stats(trace)
    n = trace.n_tokens
    for layer in range(2):
        for head in range(3):
            a = trace.weights[layer, head].astype(np.float64)
            ent = np.mean([-sum(p * math.log2(p) for p in row if p > 0) for row in a])
            assert stats.entropy[layer, head] == pytest.approx(ent, rel=1e-9)
            assert stats.to_cls[layer, head] == pytest.approx(np.mean([a[i, 0] for i in range(n)]))
            assert stats.to_sep[layer, head] == pytest.approx(np.mean([a[i, 5] + a[i, 9] for i in range(n)]))
            assert stats.to_punct[layer, head] == pytest.approx(np.mean([a[i, 3] + a[i, 8] for i in range(n)]))
            assert stats.to_self[layer, head] == pytest.approx(np.mean([a[i, i] for i in range(n)]))
            assert stats.to_prev[layer, head] == pytest.approx(np.mean([a[i, i - 1] for i in range(1, n)]))
            assert stats.to_next[layer, head] == pytest.approx(np.mean([a[i, i + 1] for i in range(n - 1)]))
            words_a, words_b = [1, 2, 3, 4], [6, 7, 8]
            assert stats.a_to_b[layer, head] == pytest.approx(np.mean([a[i, words_b].sum() for i in words_a]))
            assert stats.b_to_a[layer, head] == pytest.approx(np.mean([a[i, words_a].sum() for i in words_b]))


def test_identity_and_shift_heads_hand_worked():
    trace = synthetic_trace(8, 1, 2, pair=False)
    n = trace.n_tokens
    shift = np.zeros((n, n))
    shift[0, 0] = 1.0
    shift[np.arange(1, n), np.arange(n - 1)] = 1.0  # every token but the first looks one back
    stats = head_stats(_with_attentions(trace, np.stack([np.eye(n), shift])[None]))
    assert stats.to_self[0, 0] == 1.0 and stats.entropy[0, 0] == 0.0 and stats.to_prev[0, 0] == 0.0
    assert stats.to_prev[0, 1] == 1.0 and stats.to_self[0, 1] == pytest.approx(1 / n)
    assert stats.to_cls[0, 1] == pytest.approx(2 / n)  # [CLS] itself and the token after it


def test_uniform_head_has_log2_n_entropy_and_single_sentence_has_no_cross_share():
    trace = synthetic_trace(8, 1, 1, pair=False)
    stats = head_stats(_with_attentions(trace, np.full((1, 1, 8, 8), 1 / 8)))
    assert stats.entropy[0, 0] == pytest.approx(3.0)
    assert np.isnan(stats.a_to_b).all() and np.isnan(stats.b_to_a).all()


def test_causal_heads_never_look_at_the_next_token():
    stats = head_stats(synthetic_trace(10, 2, 2, causal=True))
    np.testing.assert_allclose(stats.to_next, 0.0, atol=1e-7)


def test_to_rows_gives_one_row_per_head_with_every_statistic():
    stats = head_stats(synthetic_trace(13, 3, 4))
    rows = stats.to_rows()
    assert len(rows) == 12
    assert list(rows[5]) == ["layer", "head", *TRACE_STAT_NAMES]
    assert (rows[5]["layer"], rows[5]["head"]) == (1, 1)
    assert rows[5]["to_sep"] == pytest.approx(float(stats.to_sep[1, 1]))
    assert set(stats.to_dict()) == set(TRACE_STAT_NAMES)


def test_max_weight_is_the_largest_single_weight_of_each_head():
    trace = synthetic_trace(12, 3, 2, seed=5)
    stats = head_stats(trace)
    for layer in range(3):
        for head in range(2):
            assert stats.max_weight[layer, head] == max(max(row) for row in trace.weights[layer, head].tolist())
