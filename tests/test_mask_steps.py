"""Mask steps: the model's own numbers, and the causal illustration on BERT's real scores."""

import numpy as np

from model_core import TraceRequest, build_trace
from model_core.analysis.mask_steps import causal_mask_np, mask_steps, softmax_rows


def test_causal_mask_equals_naive_loop():
    n = 6
    naive = np.array([[j <= i for j in range(n)] for i in range(n)])
    assert np.array_equal(causal_mask_np(n), naive)


def test_softmax_gives_exact_zero_for_minus_inf():
    w = softmax_rows(np.array([[1.0, -np.inf, 2.0]], dtype=np.float32))
    assert w[0, 1] == 0.0 and np.isclose(w.sum(), 1.0)


def test_bert_steps_are_the_models_own(bert_pair_trace, bundled):
    """The weights are the ones transformers' BertModel returns for these tokens, and the softmax of the
    masked scores shown beside them (the model's own steps, not an illustration)."""
    import torch

    s = mask_steps(bert_pair_trace, 2, 3)
    assert not s.illustrative and not s.causal and s.mask.all()
    with torch.no_grad():
        out = bundled.model(input_ids=torch.tensor(bert_pair_trace.token_ids)[None],
                            token_type_ids=torch.tensor(bert_pair_trace.token_type_ids)[None],
                            output_attentions=True)
    np.testing.assert_allclose(s.weights, out.attentions[2][0, 3].numpy(), atol=1e-5)
    np.testing.assert_allclose(softmax_rows(s.masked_scores), s.weights, atol=1e-5)


def _bert_scores(bundled, layer: int, head: int) -> np.ndarray:
    """Head ``head``'s q·kᵀ/√d_head in BertModel's layer ``layer``, from its own query and key projections of the
    hidden states entering the layer; the tokens straight from the tokenizer. Shape: (q_pos, k_pos)."""
    import torch

    from model_core import DEFAULT_TEXT_A, DEFAULT_TEXT_B

    encoded = bundled.tokenizer(DEFAULT_TEXT_A, DEFAULT_TEXT_B, return_tensors="pt")
    attention = bundled.model.encoder.layer[layer].attention.self
    d_head = attention.attention_head_size
    with torch.no_grad():
        hidden = bundled.model(**encoded, output_hidden_states=True).hidden_states[layer][0]  # (pos, hidden)
        q = attention.query(hidden)[:, head * d_head:(head + 1) * d_head]  # (pos, d_head)
        k = attention.key(hidden)[:, head * d_head:(head + 1) * d_head]
    return (q @ k.T / d_head ** 0.5).numpy()


def test_bert_causal_illustration(bert_pair_trace, bundled):
    s = mask_steps(bert_pair_trace, 2, 3, apply_causal=True)
    upper = np.triu(np.ones((13, 13), dtype=bool), 1)
    assert s.illustrative and s.causal
    assert np.isneginf(s.masked_scores[upper]).all() and (s.weights[upper] == 0).all()
    np.testing.assert_allclose(s.weights.sum(-1), 1.0, atol=1e-6)
    assert s.weights[0, 0] == 1.0  # the first query can only see itself
    scores = _bert_scores(bundled, 2, 3)
    np.testing.assert_allclose(s.scores, scores, atol=1e-4)  # the model's own scores, recomputed here
    causal = np.tril(np.exp(scores - scores.max(-1, keepdims=True)))  # the causal softmax, by hand
    np.testing.assert_allclose(s.weights, causal / causal.sum(-1, keepdims=True), atol=1e-5)


def test_custom_causal_steps_are_real():
    t = build_trace(TraceRequest("custom", "time flies like an arrow", causal=True, num_hidden_layers=2, num_attention_heads=2, hidden_size=16))
    s = mask_steps(t, 1, 1)
    assert s.causal and not s.illustrative
    np.testing.assert_allclose(softmax_rows(s.masked_scores), s.weights, atol=1e-6)


def test_scaling_keeps_std_near_one_for_random_heads():
    """Queries and keys with unit-variance entries: QKᵀ spreads as √d_head, QKᵀ/√d_head stays near 1."""
    from dataclasses import replace

    from synthetic import synthetic_trace

    rng = np.random.default_rng(0)
    unscaled = {}
    for d_head in (16, 64, 256):
        t = synthetic_trace(200, 1, 1, d_head=d_head, seed=1)
        t = replace(t, queries=rng.standard_normal(t.queries.shape).astype(np.float32),
                    keys=rng.standard_normal(t.keys.shape).astype(np.float32))
        s = mask_steps(t, 0, 0)
        assert 0.85 < s.scaled_std < 1.15, (d_head, s.scaled_std)
        assert 0.85 < s.unscaled_std / np.sqrt(d_head) < 1.15, (d_head, s.unscaled_std)
        unscaled[d_head] = s.unscaled_std
    assert 3.4 < unscaled[256] / unscaled[16] < 4.6  # grows as √d_head: √(256/16) = 4
