"""model_core.walk.encoder: each step equals the trace every other page reads, and the steps chain up."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model_core import DEFAULT_TEXT_A, DEFAULT_TEXT_B, CustomSpec, TraceRequest, build_custom_model, encode, trace_custom
from model_core.chapter3.from_bert import custom_from_bert
from model_core.models.loading import load_tokenizer
from model_core.chapter3.spec import describe_custom
from model_core.walk.encoder import Walkthrough, encoded_from_trace, walk_layer

SMALL = dict(num_hidden_layers=3, num_attention_heads=4, hidden_size=32, seed=7)


@torch.no_grad()
def _apply(module: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    """Run one of the model's own modules on a walk's array."""
    return module(torch.from_numpy(np.array(x))).numpy()


def _custom(norm: str, causal: bool):
    spec = CustomSpec(norm_placement=norm, causal=causal, **SMALL)
    model = build_custom_model(spec)
    encoded = encode(load_tokenizer(), DEFAULT_TEXT_A, DEFAULT_TEXT_B)
    return model, encoded, trace_custom(model, encoded, describe_custom(spec, model))


@pytest.fixture(scope="module", params=[("pre", True), ("post", False)], ids=["pre-causal", "post-bidirectional"])
def custom_case(request):
    model, encoded, trace = _custom(*request.param)
    return model, trace, {layer: walk_layer(model, encoded, layer) for layer in range(trace.n_layers)}


@pytest.fixture(scope="module")
def bert_case(bundled, bert_pair_trace):
    model = custom_from_bert(bundled.model)
    return model, bert_pair_trace, walk_layer(model, encoded_from_trace(bert_pair_trace), 2)


# -- equal to the trace ----------------------------------------------------------------------
def test_custom_walk_equals_the_trace_at_every_layer(custom_case):
    _, trace, walks = custom_case
    for layer, wt in walks.items():
        np.testing.assert_allclose(wt.weights, trace.weights[layer], atol=1e-6)
        np.testing.assert_allclose(wt.queries, trace.queries[layer], atol=1e-6)
        np.testing.assert_allclose(wt.keys, trace.keys[layer], atol=1e-6)
        np.testing.assert_allclose(wt.values, trace.values[layer], atol=1e-6)
        np.testing.assert_allclose(wt.layer_input, trace.hidden_states[layer], atol=1e-6)
        np.testing.assert_allclose(wt.layer_output, trace.hidden_states[layer + 1], atol=1e-6)


def test_custom_walk_logits_equal_the_trace(custom_case):
    _, trace, walks = custom_case
    for wt in walks.values():
        np.testing.assert_allclose(wt.logits, trace.logits, atol=1e-6)
        np.testing.assert_allclose(wt.probabilities.sum(), 1.0, atol=1e-6)
        np.testing.assert_allclose(wt.final_hidden, trace.hidden_states[-1], atol=1e-6)


def test_custom_walk_scores_and_mask_equal_the_trace(custom_case):
    _, trace, walks = custom_case
    wt = walks[1]
    np.testing.assert_array_equal(wt.mask, trace.mask)
    np.testing.assert_array_equal(np.isneginf(wt.masked_scores), np.isneginf(trace.masked_scores[1]))
    np.testing.assert_allclose(wt.scores, trace.scores[1], atol=1e-5)
    if wt.causal:
        assert np.isneginf(wt.masked_scores[:, 0, 1:]).all()  # the first query sees only itself
        assert not np.isneginf(wt.scores).any()  # scores are kept before the mask


def test_bert_walk_equals_bert_to_1e_4(bert_case):
    _, trace, wt = bert_case
    assert wt.tokens == trace.tokens
    np.testing.assert_array_equal(wt.token_ids, trace.token_ids)
    np.testing.assert_array_equal(wt.token_type_ids, trace.token_type_ids)
    np.testing.assert_allclose(wt.weights, trace.weights[2], atol=1e-4)
    np.testing.assert_allclose(wt.embeddings, trace.hidden_states[0], atol=1e-4)
    np.testing.assert_allclose(wt.layer_output, trace.hidden_states[3], atol=1e-4)
    np.testing.assert_allclose(wt.final_hidden, trace.hidden_states[-1], atol=1e-4)


# -- shapes ----------------------------------------------------------------------------------
def test_bert_walk_shapes(bert_case):
    _, trace, wt = bert_case
    n = trace.n_tokens
    assert n == 13 and wt.norm_placement == "post" and not wt.causal and wt.layer == 2
    s = wt.shapes()
    assert s["token_ids"] == (n,)
    for name in ("token_embeddings", "position_embeddings", "token_type_embeddings", "embedding_sum", "embeddings",
                 "layer_input", "attention_input", "concat", "attention_output", "residual_1", "ffn_input",
                 "ffn_output", "residual_2", "layer_output", "final_hidden"):
        assert s[name] == (n, 384), name
    for name in ("queries", "keys", "values", "head_outputs"):
        assert s[name] == (12, n, 32), name
    for name in ("scores", "masked_scores", "weights"):
        assert s[name] == (12, n, n), name
    assert s["ffn_hidden"] == s["ffn_activation"] == (n, 1536)
    assert s["mask"] == (n, n) and s["logits"] == s["probabilities"] == (2,)


def test_custom_walk_shapes(custom_case):
    _, trace, walks = custom_case
    s = walks[0].shapes()
    assert s["queries"] == (4, trace.n_tokens, 8)
    assert s["ffn_hidden"] == (trace.n_tokens, 128)


# -- the steps chain up (the hooks are wired to the right tensors) ----------------------------
def test_embedding_sum_is_token_plus_position_plus_type(custom_case):
    model, _, walks = custom_case
    wt = walks[0]
    np.testing.assert_allclose(wt.embedding_sum, wt.token_embeddings + wt.position_embeddings
                               + wt.token_type_embeddings, atol=1e-6)
    emb = model.encoder.embeddings
    np.testing.assert_allclose(wt.token_embeddings, emb.token_embeddings.weight[wt.token_ids.copy()].numpy(), atol=0)
    np.testing.assert_allclose(wt.token_type_embeddings,
                               emb.token_type_embeddings.weight[wt.token_type_ids.copy()].numpy(), atol=0)


def test_heads_concat_and_output_projection_chain(custom_case):
    model, _, walks = custom_case
    wt = walks[2]
    np.testing.assert_allclose(wt.head_outputs, wt.weights @ wt.values, atol=1e-5)
    for h in range(wt.n_heads):
        np.testing.assert_array_equal(wt.concat[:, h * wt.d_head:(h + 1) * wt.d_head], wt.head_outputs[h])
    w_o = model.encoder.layers[2].attention.output_linear
    np.testing.assert_allclose(wt.attention_output, _apply(w_o, wt.concat), atol=1e-5)
    np.testing.assert_allclose(wt.residual_1, wt.layer_input + wt.attention_output, atol=1e-5)


def test_feed_forward_is_linear_gelu_linear(custom_case):
    _, _, walks = custom_case
    wt = walks[1]
    np.testing.assert_allclose(wt.ffn_activation, F.gelu(torch.from_numpy(wt.ffn_hidden.copy())).numpy(), atol=1e-6)
    assert (wt.ffn_activation >= -0.17).all()  # GELU's minimum is about -0.17
    assert wt.intermediate_size == 4 * wt.hidden_size


def test_layernorm_placement_matches_the_formula(custom_case):
    model, _, walks = custom_case
    wt = walks[1]
    block = model.encoder.layers[1]
    if wt.norm_placement == "pre":
        np.testing.assert_allclose(wt.attention_input, _apply(block.layer_norm_1, wt.layer_input), atol=1e-5)
        np.testing.assert_allclose(wt.ffn_input, _apply(block.layer_norm_2, wt.residual_1), atol=1e-5)
        np.testing.assert_allclose(wt.layer_output, wt.residual_1 + wt.ffn_output, atol=1e-5)
    else:
        np.testing.assert_array_equal(wt.attention_input, wt.layer_input)
        np.testing.assert_allclose(wt.ffn_input, _apply(block.layer_norm_1, wt.residual_1), atol=1e-5)
        np.testing.assert_allclose(wt.residual_2, wt.ffn_input + wt.ffn_output, atol=1e-5)
        np.testing.assert_allclose(wt.layer_output, _apply(block.layer_norm_2, wt.residual_2), atol=1e-5)


def test_bert_walk_post_ln_chain(bert_case):
    model, _, wt = bert_case
    block = model.encoder.layers[2]
    np.testing.assert_allclose(wt.ffn_input, _apply(block.layer_norm_1, wt.layer_input + wt.attention_output), atol=1e-4)
    np.testing.assert_allclose(wt.layer_output, _apply(block.layer_norm_2, wt.ffn_input + wt.ffn_output), atol=1e-4)


# -- boundaries ------------------------------------------------------------------------------
def test_layer_out_of_range_says_the_range(custom_case):
    model, trace, _ = custom_case
    with pytest.raises(ValueError, match="layers 0-2"):
        walk_layer(model, encoded_from_trace(trace), 3)


def test_training_mode_is_refused():
    model, encoded, _ = _custom("pre", False)
    model.train()
    with pytest.raises(ValueError, match="eval"):
        walk_layer(model, encoded, 0)


def test_arrays_are_read_only(custom_case):
    wt = custom_case[2][0]
    with pytest.raises(ValueError):
        wt.weights[0, 0, 0] = 1.0
    assert isinstance(wt, Walkthrough)


def test_score_limit_is_the_largest_finite_absolute_score(custom_case):
    wt = custom_case[2][1]
    assert wt.score_limit(1) == pytest.approx(float(np.abs(wt.scores[1]).max()))
    assert np.isfinite(wt.score_limit(0))


def test_token_norms_rejects_a_non_token_field(custom_case):
    wt = custom_case[2][0]
    assert wt.token_norms("embeddings").shape == (wt.n_tokens,)
    with pytest.raises(ValueError, match="not a per-token field"):
        wt.token_norms("weights")


# -- the cached loader -----------------------------------------------------------------------
def test_loader_walks_the_same_inputs_as_get_trace():
    from ui.loaders import get_trace, get_walkthrough

    request = TraceRequest("custom", DEFAULT_TEXT_A, DEFAULT_TEXT_B, causal=True, num_hidden_layers=2, num_attention_heads=2,
                           hidden_size=32)
    trace = get_trace(request)
    wt = get_walkthrough(request, 1)
    assert wt.tokens == trace.tokens
    np.testing.assert_allclose(wt.weights, trace.weights[1], atol=1e-6)
    np.testing.assert_allclose(wt.logits, trace.logits, atol=1e-6)
    assert get_walkthrough(request, 1) is wt  # cached


def test_bert_walk_shares_the_loaded_from_bert_model_spec():
    bert = TraceRequest("bert", model_id="bundled:all-MiniLM-L6-v2")
    pretrained = TraceRequest("custom", model_id="bundled:all-MiniLM-L6-v2", weights="pretrained", seed=0)
    expected = CustomSpec(weights="pretrained", seed=0, causal=False, norm_placement="post",
                          model_id="bundled:all-MiniLM-L6-v2")
    assert bert.walk_spec() == expected == pretrained.walk_spec() == pretrained.spec()
