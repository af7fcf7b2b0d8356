"""Maths of the from-scratch encoder: softmax rows, the causal mask, -inf before and 0 after softmax."""

import math

import numpy as np
import pytest
import torch

from model_core.chapter3.config import EncoderConfig
from model_core.chapter3.model import (
    FeedForward,
    TransformerEncoderLayer,
    attention_step,
    build_random_model,
    causal_mask,
    scaled_dot_product_attention,
)

SMALL = EncoderConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=32, max_position_embeddings=32)


def test_causal_mask_equals_naive_loop():
    for n in (1, 2, 7):
        naive = torch.tensor([[1.0 if j <= i else 0.0 for j in range(n)] for i in range(n)])
        assert torch.equal(causal_mask(n), naive)


def test_weights_rows_sum_to_one():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 5, 8) for _ in range(3))
    step = attention_step(q, k, v)
    torch.testing.assert_close(step.weights.sum(-1), torch.ones(2, 5))


def test_scores_are_scaled_dot_products():
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 4, 9) for _ in range(3))
    step = attention_step(q, k, v)
    naive = torch.tensor([[float(q[0, i] @ k[0, j]) / math.sqrt(9) for j in range(4)] for i in range(4)])
    torch.testing.assert_close(step.scores[0], naive)


def test_masked_scores_are_minus_inf_above_diagonal_and_weights_zero():
    torch.manual_seed(2)
    q, k, v = (torch.randn(1, 6, 4) for _ in range(3))
    step = attention_step(q, k, v, causal_mask(6))
    upper = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    assert torch.isneginf(step.masked_scores[0][upper]).all()
    assert torch.isfinite(step.masked_scores[0][~upper]).all()
    assert (step.weights[0][upper] == 0).all()
    torch.testing.assert_close(step.weights.sum(-1), torch.ones(1, 6))


def test_book_signature_returns_output_only():
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, 3, 4) for _ in range(3))
    out = scaled_dot_product_attention(q, k, v)
    assert out.shape == (1, 3, 4)
    torch.testing.assert_close(out, torch.softmax(q @ k.transpose(1, 2) / 2.0, -1) @ v)


def test_feed_forward_is_linear_gelu_linear_dropout():
    ff = FeedForward(SMALL)
    names = [name for name, _ in ff.named_children()]
    assert names == ["linear_1", "linear_2", "gelu", "dropout"]
    assert ff.dropout.p == SMALL.hidden_dropout_prob  # not nn.Dropout()'s 0.5
    ff.eval()
    x = torch.randn(2, 3, 16)
    expected = ff.linear_2(torch.nn.functional.gelu(ff.linear_1(x)))
    torch.testing.assert_close(ff(x), expected)


def test_pre_ln_layer_matches_hand_written_formula_and_keeps_input():
    torch.manual_seed(4)
    layer = TransformerEncoderLayer(SMALL).eval()
    x = torch.randn(1, 5, 16)
    x_before = x.clone()
    out = layer(x).output
    assert torch.equal(x, x_before)  # residuals are added out of place
    h = x + layer.attention(layer.layer_norm_1(x))[0]
    torch.testing.assert_close(out, h + layer.feed_forward(layer.layer_norm_2(h)))


def test_post_ln_layer_matches_bert_formula():
    torch.manual_seed(5)
    layer = TransformerEncoderLayer(SMALL.replace(norm_placement="post")).eval()
    x = torch.randn(1, 5, 16)
    h = layer.layer_norm_1(x + layer.attention(x)[0])
    torch.testing.assert_close(layer(x).output, layer.layer_norm_2(h + layer.feed_forward(h)))


def test_padding_mask_is_honoured_in_a_batch():
    model = build_random_model(SMALL.replace(causal=True), seed=0)
    ids = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0]])
    pad = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    out = model(ids, attention_mask=pad).encoder
    w = out.layers[0].heads[0].step.weights  # (B, q, k)
    assert (w[1, :, 3:] == 0).all()
    assert (torch.triu(w[0], diagonal=1) == 0).all()
    # The padded sequence's real tokens see the same thing as the same sequence unpadded.
    alone = model(ids[1:, :3]).encoder
    torch.testing.assert_close(out.last_hidden_state[1, :3], alone.last_hidden_state[0])


def test_random_weights_are_seeded():
    a = build_random_model(SMALL, seed=7)
    b = build_random_model(SMALL, seed=7)
    c = build_random_model(SMALL, seed=8)
    wa, wb, wc = (m.encoder.layers[0].attention.heads[0].q.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_head_gate_zeroes_weights_and_changes_output():
    model = build_random_model(SMALL, seed=0)
    ids = torch.tensor([[1, 5, 6, 7, 2]])
    gate = torch.ones(2, 4)
    gate[0, 1] = 0
    off = model(ids, head_mask=gate)
    on = model(ids)
    assert (off.encoder.layers[0].heads[1].step.weights == 0).all()
    assert not torch.allclose(off.logits, on.logits)


@pytest.mark.parametrize("bad", [dict(hidden_size=10, num_attention_heads=3), dict(num_hidden_layers=0),
                                 dict(norm_placement="middle"), dict(hidden_dropout_prob=1.5)])
def test_config_validation_says_what_is_wrong(bad):
    with pytest.raises(ValueError):
        EncoderConfig(**bad)


def test_default_config_is_bert_base_shape():
    c = EncoderConfig()
    assert (c.num_hidden_layers, c.num_attention_heads, c.hidden_size, c.head_dim) == (12, 12, 768, 64)
    assert np.isclose(EncoderConfig().hidden_dropout_prob, 0.1)
