"""Norm-weighted attention (Kobayashi et al. 2020) against naive vector computations."""

import numpy as np
import pytest

from model_core.analysis.norms import norm_weighted_attention, special_token_mass
from synthetic import synthetic_trace


def test_norm_weighted_equals_norm_of_weighted_transformed_vectors():
    # Build f(x_j) = v_j W_O^h explicitly and take ||alpha_ij f(x_j)|| one entry at a time.
    rng = np.random.default_rng(0)
    n_layers, n_heads, n, d_head, hidden = 2, 3, 5, 4, 12
    values = rng.standard_normal((n_layers, n_heads, n, d_head))
    w_o = rng.standard_normal((n_layers, n_heads, d_head, hidden))
    att = rng.random((n_layers, n_heads, n, n))
    att /= att.sum(-1, keepdims=True)
    value_norms = np.linalg.norm(values @ w_o, axis=-1)
    expected = np.zeros_like(att)
    for layer in range(n_layers):
        for head in range(n_heads):
            for i in range(n):
                for j in range(n):
                    vec = att[layer, head, i, j] * (values[layer, head, j] @ w_o[layer, head])
                    expected[layer, head, i, j] = np.linalg.norm(vec)
    np.testing.assert_allclose(norm_weighted_attention(att, value_norms), expected, rtol=1e-10)


def test_norm_weighted_rejects_mismatched_norms():
    with pytest.raises(ValueError, match="value_norms must be"):
        norm_weighted_attention(np.ones((2, 2, 3, 3)), np.ones((2, 2, 4)))


def test_special_token_mass_hand_worked_small_sep_value():
    # Every query puts 0.8 on [SEP], whose value vector is tiny (norm 0.01).
    tokens = ("[CLS]", "word", "[SEP]")
    trace = synthetic_trace(tokens=tokens, n_layers=1, n_heads=1)
    att = np.tile(np.array([0.1, 0.1, 0.8], dtype=np.float32), (1, 1, 3, 1))
    norms = np.array([[[1.0, 1.0, 0.01]]], dtype=np.float32)
    trace = type(trace)(**{**trace.__dict__, "weights": att, "value_norms": norms})
    mass = special_token_mass(trace)
    assert mass.raw_sep[0, 0] == pytest.approx(0.8)
    assert mass.raw_cls[0, 0] == pytest.approx(0.1)
    assert mass.norm_sep[0, 0] == pytest.approx(0.008 / 0.208, rel=1e-5)
    assert mass.norm_cls[0, 0] == pytest.approx(0.1 / 0.208, rel=1e-5)


def test_special_token_mass_matches_naive_loop_on_a_pair():
    trace = synthetic_trace(13, 2, 3, seed=6)
    mass = special_token_mass(trace)
    seps = [k for k, t in enumerate(trace.tokens) if t == "[SEP]"]
    for layer in range(2):
        for head in range(3):
            weighted = trace.weights[layer, head].astype(np.float64) * trace.value_norms[layer, head]
            assert mass.norm_sep[layer, head] == pytest.approx(weighted[:, seps].sum() / weighted.sum())
            assert mass.raw_sep[layer, head] == pytest.approx(trace.weights[layer, head][:, seps].sum() / 13)
    assert set(mass.per_layer()) == {"raw [CLS]", "raw [SEP]", "norm-weighted [CLS]", "norm-weighted [SEP]"}
    assert mass.per_layer()["raw [SEP]"].shape == (2,)
