"""Parity: the from-scratch encoder with BERT's weights reproduces transformers' BertModel."""

import numpy as np
import pytest
import torch

from model_core.chapter3.from_bert import custom_from_bert
from model_core.models.loading import load_tokenizer
from model_core.families.encoding import encode
from model_core.trace.forward import trace_custom, trace_pretrained

LONG_TEXT = ("Attention lets every token look at every other token. " * 20).strip()


def _compare(bert_model, input_ids, token_type_ids, atol=1e-4):
    custom = custom_from_bert(bert_model)
    with torch.no_grad():
        ref = bert_model(input_ids=input_ids, token_type_ids=token_type_ids, output_attentions=True,
                         output_hidden_states=True)
        mine = custom(input_ids, token_type_ids).encoder
    for layer, ref_att in enumerate(ref.attentions):
        ours = torch.stack([h.step.weights for h in mine.layers[layer].heads], dim=1)
        torch.testing.assert_close(ours, ref_att, atol=atol, rtol=0)
    for ours, theirs in zip(mine.hidden_states, ref.hidden_states):
        torch.testing.assert_close(ours, theirs, atol=atol, rtol=0)


def test_parity_tiny_random_bert(tiny_bert):
    ids = torch.tensor([[1, 7, 8, 9, 2, 10, 11, 2]])
    types = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1]])
    _compare(tiny_bert, ids, types)


def test_parity_bundled_seed_pair(bundled):
    enc = encode(bundled.tokenizer, "time flies like an arrow", "fruit flies like a banana")
    _compare(bundled.model, enc.input_ids, enc.token_type_ids)


@pytest.mark.slow
def test_parity_bundled_128_tokens(bundled):
    enc = encode(bundled.tokenizer, LONG_TEXT, max_tokens=128, truncate=True)
    assert enc.input_ids.shape[1] == 128
    _compare(bundled.model, enc.input_ids, enc.token_type_ids)


def test_trace_of_both_models_agree_on_bundled_weights(bundled):
    enc = encode(bundled.tokenizer, "time flies like an arrow", "fruit flies like a banana")
    a = trace_pretrained(bundled, enc)
    b = trace_custom(custom_from_bert(bundled.model), enc, "custom")
    np.testing.assert_allclose(a.weights, b.weights, atol=1e-4)
    np.testing.assert_allclose(a.queries, b.queries, atol=1e-4)
    np.testing.assert_allclose(a.value_norms, b.value_norms, atol=1e-3)
    np.testing.assert_allclose(a.head_scores(2, 5), b.head_scores(2, 5), atol=1e-3)


def test_bert_head_masking_matches_custom_gate(bundled):
    enc = encode(bundled.tokenizer, "the bank vault", "the river bank")
    mask = np.ones((6, 12), dtype=bool)
    mask[1, [0, 4]] = False
    a = trace_pretrained(bundled, enc, head_mask=mask)
    b = trace_custom(custom_from_bert(bundled.model), enc, "custom", head_mask=mask)
    np.testing.assert_allclose(a.hidden_states, b.hidden_states, atol=1e-4)
    assert (a.weights[1, 0] == 0).all() and (b.weights[1, 4] == 0).all()
    plain = trace_pretrained(bundled, enc)
    assert np.abs(plain.hidden_states[-1] - a.hidden_states[-1]).max() > 1e-3


def test_bundled_tokenizer_is_uncased_bert_wordpiece():
    tok = load_tokenizer()
    enc = encode(tok, "Time FLIES", "unaffable")
    assert enc.tokens[0] == "[CLS]" and enc.tokens[-1] == "[SEP]"
    assert "time" in enc.tokens and "flies" in enc.tokens
    assert any(t.startswith("##") for t in enc.tokens)
