"""Parity: every decoder family's trace equals transformers' eager model (tests/decoder_reference.py)."""

from functools import lru_cache

import numpy as np
import pytest
import torch

from decoder_reference import (
    reference_forward, reference_masked_logits, reference_qkv, reference_value_norms, sentence_b_start,
)
from tiny_models import NUM_HEADS, NUM_LAYERS

TEXT_A = "time flies like an arrow"
TEXT_B = "fruit flies like a banana"
PAIR = TEXT_A + "\n" + TEXT_B  # how the app joins a pair
ATOL = 1e-5
TOP_K = 10


@lru_cache(maxsize=None)
def _trace(folder: str, text_a: str, text_b: str = "", off: tuple[int, int] | None = None):
    """The app's trace (cached: traces are read-only); ``off`` is the one (layer, head) switched off."""
    from model_core import TraceRequest, build_trace

    mask = None
    if off is not None:
        mask = tuple(tuple((layer, head) != off for head in range(NUM_HEADS)) for layer in range(NUM_LAYERS))
    return build_trace(TraceRequest("pretrained", text_a, text_b, model_id=folder, head_mask=mask), device="cpu")


def trace_of(folder, off=None):
    return _trace(str(folder), TEXT_A, TEXT_B, off)


def _top_k(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reference top-k ids (largest logit first) and their softmax probabilities. Shape: (pos, k) each."""
    ids = np.argsort(-logits, axis=-1, kind="stable")[:, :TOP_K]
    probs = torch.softmax(torch.tensor(logits), dim=-1).numpy()
    return ids, np.take_along_axis(probs, ids, axis=-1)


def _softmax(scores: np.ndarray) -> np.ndarray:
    scores = scores - scores.max(axis=-1, keepdims=True)  # rows keep their diagonal, so no row is all -inf
    weights = np.exp(scores)
    return weights / weights.sum(axis=-1, keepdims=True)


# -- what the trace is ------------------------------------------------------------------------------------
def test_trace_is_a_decoder_of_its_family(tiny_decoder):
    trace = trace_of(tiny_decoder)
    assert trace.is_decoder and trace.causal
    assert trace.model_kind == ("gpt2" if tiny_decoder.name == "gpt2" else "llama")
    assert trace.logits is None


def test_tokens_are_the_tokenizers_own(tiny_decoder):
    trace = _trace(str(tiny_decoder), TEXT_A)
    assert trace.tokens == reference_forward(tiny_decoder, TEXT_A).tokens
    assert trace.sentence_b_start is None


def test_pair_is_joined_by_a_newline(tiny_decoder):
    trace = trace_of(tiny_decoder)
    assert trace.tokens == reference_forward(tiny_decoder, PAIR).tokens
    assert trace.sentence_b_start == sentence_b_start(tiny_decoder, TEXT_A, TEXT_B)
    assert trace.tokens[trace.sentence_b_start - 1] == "Ċ"
    assert "[CLS]" not in trace.tokens and "[SEP]" not in trace.tokens


# -- attention ----------------------------------------------------------------------------------------------
def test_attentions_equal_eager(tiny_decoder):
    trace = trace_of(tiny_decoder)
    assert trace.weights.dtype == np.float32
    np.testing.assert_allclose(trace.weights, reference_forward(tiny_decoder, PAIR).weights,
                               atol=ATOL, rtol=0)


def test_rows_sum_to_one(tiny_decoder):
    np.testing.assert_allclose(trace_of(tiny_decoder).weights.sum(-1), 1.0, atol=ATOL)


def test_future_entries_are_exactly_zero(tiny_decoder):
    trace = trace_of(tiny_decoder)
    future = np.triu(np.ones((trace.n_tokens, trace.n_tokens), dtype=bool), k=1)
    assert (trace.weights[..., future] == 0).all()
    np.testing.assert_array_equal(trace.mask, ~future)


def test_masked_scores_are_minus_inf_above_the_diagonal(tiny_decoder):
    trace = trace_of(tiny_decoder)
    future = np.triu(np.ones((trace.n_tokens, trace.n_tokens), dtype=bool), k=1)
    masked = trace.masked_scores
    assert np.isneginf(masked[..., future]).all()
    assert np.isfinite(masked[..., ~future]).all()


def test_masked_scores_reproduce_the_attentions(tiny_decoder):
    """softmax(q·k * score_scale, causal) is the eager pattern: the stored q, k and scale are the model's."""
    trace = trace_of(tiny_decoder)
    np.testing.assert_allclose(_softmax(trace.masked_scores), trace.weights, atol=ATOL, rtol=0)


# -- per-head vectors -------------------------------------------------------------------------------------
def test_queries_are_after_the_rotary_embedding(tiny_decoder):
    np.testing.assert_allclose(trace_of(tiny_decoder).queries, reference_qkv(tiny_decoder, PAIR).queries,
                               atol=ATOL, rtol=0)


def test_keys_are_expanded_to_query_heads(tiny_decoder):
    ref = reference_qkv(tiny_decoder, PAIR)
    np.testing.assert_allclose(trace_of(tiny_decoder).keys, ref.keys[:, ref.kv_heads], atol=ATOL, rtol=0)


def test_values_are_expanded_to_query_heads(tiny_decoder):
    ref = reference_qkv(tiny_decoder, PAIR)
    np.testing.assert_allclose(trace_of(tiny_decoder).values, ref.values[:, ref.kv_heads], atol=ATOL, rtol=0)


def test_kv_heads_map_query_heads_to_their_shared_head(tiny_decoder):
    kv_heads = trace_of(tiny_decoder).kv_heads
    assert kv_heads.dtype == np.int64
    np.testing.assert_array_equal(kv_heads, reference_qkv(tiny_decoder, PAIR).kv_heads)


def test_score_scale_is_the_models(tiny_decoder):
    assert trace_of(tiny_decoder).score_scale == pytest.approx(reference_qkv(tiny_decoder, PAIR).scaling,
                                                               rel=1e-6)


def test_value_norms_equal_projected_values(tiny_decoder):
    np.testing.assert_allclose(trace_of(tiny_decoder).value_norms, reference_value_norms(tiny_decoder, PAIR),
                               atol=ATOL, rtol=0)


# -- the residual stream and the predictions --------------------------------------------------------------
def test_hidden_states_are_embeddings_then_every_layer_before_the_final_norm(tiny_decoder):
    trace = trace_of(tiny_decoder)
    ref = reference_forward(tiny_decoder, PAIR)
    assert trace.hidden_states.shape == ref.hidden_states.shape == (NUM_LAYERS + 1, trace.n_tokens,
                                                                    ref.hidden_states.shape[-1])
    np.testing.assert_allclose(trace.hidden_states, ref.hidden_states, atol=ATOL, rtol=0)


def test_next_token_predictions_are_the_top_k_of_the_logits(tiny_decoder):
    trace = trace_of(tiny_decoder)
    ids, probs = _top_k(reference_forward(tiny_decoder, PAIR).logits)
    assert trace.next_token_ids.shape == trace.next_token_probs.shape == (trace.n_tokens, TOP_K)
    np.testing.assert_array_equal(trace.next_token_ids, ids)
    np.testing.assert_allclose(trace.next_token_probs, probs, atol=ATOL, rtol=0)
    assert (np.diff(trace.next_token_probs, axis=-1) <= 0).all()


# -- switching a head off ---------------------------------------------------------------------------------
@pytest.mark.parametrize("off", [(0, 1), (1, NUM_HEADS - 1)], ids=["layer0-head1", "layer1-last-head"])
def test_head_off_equals_zeroing_its_output_projection_slice(tiny_decoder, off):
    trace = trace_of(tiny_decoder, off)
    ref = reference_masked_logits(tiny_decoder, PAIR, *off)
    ids, probs = _top_k(ref.logits)
    np.testing.assert_allclose(trace.hidden_states, ref.hidden_states, atol=ATOL, rtol=0)
    np.testing.assert_array_equal(trace.next_token_ids, ids)
    np.testing.assert_allclose(trace.next_token_probs, probs, atol=ATOL, rtol=0)
    assert not trace.head_mask[off] and trace.head_mask.sum() == NUM_LAYERS * NUM_HEADS - 1


@pytest.mark.parametrize("off", [(0, 1), (1, NUM_HEADS - 1)], ids=["layer0-head1", "layer1-last-head"])
def test_head_off_has_zero_attention_and_the_rest_is_eager(tiny_decoder, off):
    trace = trace_of(tiny_decoder, off)
    expected = reference_masked_logits(tiny_decoder, PAIR, *off).weights.copy()
    expected[off] = 0  # BERT's convention: a head that is off shows no attention
    assert (trace.weights[off] == 0).all()
    np.testing.assert_allclose(trace.weights, expected, atol=ATOL, rtol=0)


def test_head_off_changes_what_follows(tiny_decoder):
    """The masked reference differs from the plain run, so the masking tests above can fail."""
    plain, masked = trace_of(tiny_decoder), trace_of(tiny_decoder, (0, 1))
    assert np.abs(plain.hidden_states[-1] - masked.hidden_states[-1]).max() > 1e-3
    assert np.abs(plain.weights[1] - masked.weights[1]).max() > 1e-3
