"""Contributions: the exact fast proximity equals the definition, the renormalising threshold, and the encoders
(BERT and the chapter-3 encoder, post-LN: every part through the frozen LayerNorm) against a plain reference."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from model_core.effects.contributions import EPS, renormalise, term_proximity

TEXT = "The bank of the river was calm."


@pytest.mark.parametrize("fragile", [1, 4, 16, 64])
def test_term_proximity_equals_the_definition(fragile):
    g = torch.Generator().manual_seed(0)
    rows, heads, keys, d = 5, 3, 7, 16
    weights = torch.rand(rows, heads, keys, generator=g, dtype=torch.float64) ** 3
    directions = torch.randn(heads, d, keys, generator=g, dtype=torch.float64) * 3
    whole = torch.randn(rows, d, generator=g, dtype=torch.float64)
    whole[0, :4] = 0.0  # a zero dimension: sign(0) must count as +
    whole[1, 2] = 1e-9
    expected = torch.empty(rows, heads, keys, dtype=torch.float64)
    for r in range(rows):
        for h in range(heads):
            for k in range(keys):
                part = weights[r, h, k] * directions[h, :, k]
                expected[r, h, k] = whole[r].abs().sum() - (part - whole[r]).abs().sum()
    got = term_proximity(weights, directions, whole, fragile=fragile)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)


def test_renormalise_keeps_survivors_and_never_nan():
    parts = np.array([[0.5, 0.03, 0.2], [0.01, 0.02, 0.0]])
    residual = np.array([0.27, 0.03])
    kept, res = renormalise(parts, residual, 0.04)
    np.testing.assert_allclose(kept[0], [0.5 / 0.97, 0.0, 0.2 / 0.97], rtol=1e-6)
    assert res[0] == pytest.approx(0.27 / 0.97)
    assert not np.isnan(kept).any() and not np.isnan(res).any()
    assert kept[1].sum() == 0 and res[1] == 0  # nothing above the threshold: no incoming edges


# -- encoders ---------------------------------------------------------------------------------------
def _frozen_ln(module, x):
    """A plain frozen LayerNorm: (part - mean) * scale * gain, with x's statistics."""
    scale = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + module.eps)  # (q, 1)

    def apply(part):  # part (q, ..., d): each query's parts with that query's scale
        s = scale.view(len(scale), *([1] * (part.dim() - 1)))
        return (part - part.mean(-1, keepdim=True)) * s * module.weight.double()
    return apply


def _check_attention_block(got, x, weights, values, output, norm=None):
    """One layer's attention shares (``got``) against the plain computation from resid_pre ``x`` (q, d), the weights
    (head, q, k), the values (head, k, d_head) and the output projection: the terms add to the residual directly
    (pre-LN), or go through ``norm`` frozen at its input (post-LN). Returns resid_mid."""
    terms = _terms(weights, values, output.weight)
    attn_out = terms.sum((1, 2)) + output.bias
    if norm is None:
        mid = x + attn_out
        exp_terms, exp_res = _expected(terms, x, mid, weights)
    else:
        frozen = _frozen_ln(norm, x + attn_out)
        mid = norm(x + attn_out)
        exp_terms, exp_res = _expected(frozen(terms), frozen(x), mid, weights)
    np.testing.assert_allclose(got.attention_heads, exp_terms, atol=1e-5)
    np.testing.assert_allclose(got.attention_residual, exp_res, atol=1e-5)
    return mid


def _expected(terms, residual, whole, weights):
    """Reference shares of one layer: terms (q, k, head, d) and residual (q, d) against whole (q, d)."""
    n, _, n_heads, _ = terms.shape
    out_terms = np.zeros((n, n, n_heads))
    out_res = np.zeros(n)
    for i in range(n):
        prox_t = torch.clamp(whole[i].abs().sum() - (terms[i] - whole[i]).abs().sum(-1), min=EPS)
        prox_t = prox_t * (weights[:, i, :].T > 0)
        prox_r = torch.clamp(whole[i].abs().sum() - (residual[i] - whole[i]).abs().sum(), min=EPS)
        total = prox_t.sum() + prox_r
        out_terms[i], out_res[i] = (prox_t / total).numpy(), float(prox_r / total)
    return out_terms, out_res


def _terms(weights, values, w_o):
    """Plain loops: (q, k, head, d) terms α·W_Oʰ·v. weights (head, q, k), values (head, k, d_head)."""
    n_heads, n, _ = weights.shape
    d_head = values.shape[-1]
    terms = torch.zeros(n, n, n_heads, w_o.shape[0], dtype=torch.float64)
    for h in range(n_heads):
        for j in range(n):
            terms[:, j, h] = weights[h, :, j, None] * (w_o[:, h * d_head:(h + 1) * d_head] @ values[h, j])
    return terms


@torch.no_grad()
def test_bert_contributions_equal_a_plain_reference(bundled):
    from model_core import TraceRequest, build_trace
    from model_core.effects.graph_source import trace_flow

    trace = build_trace(TraceRequest("pretrained", TEXT), device="cpu")
    flow = trace_flow(trace, bundled.model, bundled.family)
    for layer in range(len(bundled.model.encoder.layer)):  # every layer
        block = copy.deepcopy(bundled.model.encoder.layer[layer]).double()  # the shared model stays as it is
        x = torch.from_numpy(trace.hidden_states[layer]).double()
        weights = torch.from_numpy(trace.weights[layer]).double()
        values = block.attention.self.value(x).view(len(x), trace.n_heads, -1).transpose(0, 1)
        out = block.attention.output
        got = flow.layer(layer)
        mid = _check_attention_block(got, x, weights, values, out.dense, out.LayerNorm)
        ffn = block.output.dense(block.intermediate(mid))
        ln2 = _frozen_ln(block.output.LayerNorm, mid + ffn)
        post = torch.from_numpy(trace.hidden_states[layer + 1]).double()
        for i in range(len(x)):
            prox = [torch.clamp(post[i].abs().sum() - (p - post[i]).abs().sum(), min=EPS)
                    for p in (ln2(ffn)[i], ln2(mid)[i])]
            assert got.ffn[i] == pytest.approx(float(prox[0] / sum(prox)), abs=1e-5)


@pytest.mark.parametrize("norm", ["pre", "post"])
@torch.no_grad()
def test_chapter3_encoder_contributions_equal_a_plain_reference(norm):
    from model_core import TraceRequest
    from model_core.effects.graph_source import trace_flow
    from model_core.trace.forward import trace_model
    from model_core.trace.resolve import resolve

    request = TraceRequest("custom", TEXT, num_hidden_layers=2, num_attention_heads=4, hidden_size=64,
                           norm_placement=norm, seed=3)
    resolved = resolve(request, device="cpu")
    trace = trace_model(resolved.family, resolved.model, resolved.encode(request), "test")
    flow = trace_flow(trace, resolved.model, resolved.family)
    for layer, block in enumerate(resolved.model.encoder.layers):
        block = copy.deepcopy(block).double()
        x = torch.from_numpy(trace.hidden_states[layer]).double()
        post = torch.from_numpy(trace.hidden_states[layer + 1]).double()
        weights = torch.from_numpy(trace.weights[layer]).double()
        values = torch.from_numpy(trace.values[layer]).double()
        got = flow.layer(layer)
        mid = _check_attention_block(got, x, weights, values, block.attention.output_linear,
                                     None if norm == "pre" else block.layer_norm_1)
        # the MLP block: pre-LN adds its output to resid_mid; post-LN's parts go through LN2 frozen at its input
        if norm == "pre":
            ffn = block.feed_forward(block.layer_norm_2(mid))
            parts = (ffn, mid)
        else:
            ffn = block.feed_forward(mid)
            ln2 = _frozen_ln(block.layer_norm_2, mid + ffn)
            parts = (ln2(ffn), ln2(mid))
        torch.testing.assert_close(mid + ffn if norm == "pre" else block.layer_norm_2(mid + ffn), post,
                                   atol=1e-4, rtol=0)  # the reference rebuilds the trace's resid_post
        for i in range(len(x)):
            prox = [torch.clamp(post[i].abs().sum() - (p[i] - post[i]).abs().sum(), min=EPS) for p in parts]
            assert got.ffn[i] == pytest.approx(float(prox[0] / sum(prox)), abs=1e-5)
            assert got.ffn_residual[i] == pytest.approx(float(prox[1] / sum(prox)), abs=1e-5)


def test_head_shares_put_contribution_on_attentions_footing():
    from model_core.effects.contributions import head_shares

    terms = np.array([[[0.2, 0.2, 0.0], [0.05, 0.0, 0.05], [0.0, 0.0, 0.0]]])  # (row, head, key); residual left out
    within, of_terms = head_shares(terms)
    np.testing.assert_allclose(within[0, 0], [0.5, 0.5, 0.0])
    np.testing.assert_allclose(within[0, 1], [0.5, 0.0, 0.5])  # a head row sums to 1, as attention's does
    np.testing.assert_allclose(within[0, 2], 0.0)  # no terms: zeros, not NaN
    np.testing.assert_allclose(of_terms[0], [0.8, 0.2, 0.0])  # a head's part of the non-residual mass
