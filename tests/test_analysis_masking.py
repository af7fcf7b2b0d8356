"""Head-masking comparison against naive computations."""

import numpy as np
import pytest

from model_core.analysis.masking import compare_masking, head_mask_from_off
from synthetic import synthetic_trace


def test_identical_traces_show_no_effect():
    trace = synthetic_trace(13, 2, 3, seed=0)
    effect = compare_masking(trace, trace)
    np.testing.assert_allclose(effect.cls_cosine, 1.0, atol=1e-9)
    np.testing.assert_allclose(effect.cls_l2, 0.0, atol=1e-9)
    np.testing.assert_allclose(effect.attention_tv, 0.0, atol=1e-9)
    np.testing.assert_allclose(effect.attention_js, 0.0, atol=1e-9)
    assert effect.prediction_changed is False and effect.first_masked_layer is None


def test_effect_matches_naive_loops_and_blanks_switched_off_heads():
    base = synthetic_trace(13, 2, 3, seed=0)
    mask = head_mask_from_off(2, 3, [(1, 2)])
    masked = synthetic_trace(13, 2, 3, seed=1, head_mask=mask)
    effect = compare_masking(base, masked)
    assert effect.masked_heads.tolist() == [[False, False, False], [False, False, True]]
    assert effect.first_masked_layer == 1
    assert np.isnan(effect.attention_tv[1, 2]) and np.isnan(effect.attention_js[1, 2])
    for layer, head in [(0, 0), (1, 1)]:
        p = base.weights[layer, head].astype(np.float64)
        q = masked.weights[layer, head].astype(np.float64)
        tv = np.mean([0.5 * sum(abs(p[i, k] - q[i, k]) for k in range(13)) for i in range(13)])
        assert effect.attention_tv[layer, head] == pytest.approx(tv)
    h1 = base.hidden_states[:, 0].astype(np.float64)
    h2 = masked.hidden_states[:, 0].astype(np.float64)
    for layer in range(3):
        cos = h1[layer] @ h2[layer] / (np.linalg.norm(h1[layer]) * np.linalg.norm(h2[layer]))
        assert effect.cls_cosine[layer] == pytest.approx(cos)
        assert effect.cls_l2[layer] == pytest.approx(np.linalg.norm(h1[layer] - h2[layer]))
    np.testing.assert_allclose(effect.logits_delta, masked.logits.astype(np.float64) - base.logits)


def test_traces_of_different_inputs_are_refused():
    with pytest.raises(ValueError, match="same input"):
        compare_masking(synthetic_trace(13, 2, 2), synthetic_trace(14, 2, 2))


def test_no_logits_gives_no_delta():
    base = synthetic_trace(13, 1, 2, logits=False)
    effect = compare_masking(base, base)
    assert effect.logits_delta is None and effect.prediction_changed is None


def test_head_mask_from_off_rejects_missing_heads():
    assert head_mask_from_off(2, 2, []).all()
    with pytest.raises(ValueError, match="heads 0-1"):
        head_mask_from_off(2, 2, [(0, 2)])


@pytest.mark.parametrize("causal", [False, True])
def test_tv_and_js_equal_naive_loops_across_row_blocks(causal):
    """300 tokens span three of compare_masking's row blocks; a causal block reads only the keys its rows see."""
    n = 300
    base = synthetic_trace(n, 2, 2, seed=3, causal=causal)
    masked = synthetic_trace(n, 2, 2, seed=4, causal=causal, head_mask=head_mask_from_off(2, 2, [(1, 1)]))
    effect = compare_masking(base, masked)
    for layer, head in [(0, 0), (0, 1), (1, 0)]:
        p = base.weights[layer, head].astype(np.float64)
        q = masked.weights[layer, head].astype(np.float64)
        tvs, jss = [], []
        for i in range(n):
            pi, qi = p[i] / p[i].sum(), q[i] / q[i].sum()
            m = 0.5 * (pi + qi)
            kl = lambda a: sum(a[k] * np.log2(a[k] / m[k]) for k in range(n) if a[k] > 0)  # noqa: E731
            tvs.append(0.5 * np.abs(p[i] - q[i]).sum())
            jss.append(0.5 * kl(pi) + 0.5 * kl(qi))
        assert effect.attention_tv[layer, head] == pytest.approx(np.mean(tvs), rel=1e-9)
        assert effect.attention_js[layer, head] == pytest.approx(np.mean(jss), rel=1e-6)
