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
        p = base.attentions[layer, head].astype(np.float64)
        q = masked.attentions[layer, head].astype(np.float64)
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
