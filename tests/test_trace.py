"""AttentionTrace from both models: shapes, scores, masks, sentence B, token limits."""

import numpy as np
import pytest
from scipy.special import softmax

from model_core import DEFAULT_TEXT_A, DEFAULT_TEXT_B, InputError, TraceRequest, build_trace
from model_core.models.loading import load_tokenizer
from model_core.families.encoding import encode

SMALL = dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=32)


def test_bert_trace_shapes_and_pair(bert_pair_trace):
    t = bert_pair_trace
    assert t.tokens == ("[CLS]", "time", "flies", "like", "an", "arrow", "[SEP]",
                        "fruit", "flies", "like", "a", "banana", "[SEP]")
    assert t.weights.shape == (6, 12, 13, 13)
    assert t.queries.shape == t.keys.shape == (6, 12, 13, 32)
    assert t.hidden_states.shape == (7, 13, 384)
    assert t.sentence_b_start == 7
    assert list(t.token_type_ids) == [0] * 7 + [1] * 6
    assert t.model_kind == "bert" and not t.causal and t.mask.all()


def test_bert_scores_from_hooks_reproduce_the_weights(bert_pair_trace):
    np.testing.assert_allclose(softmax(bert_pair_trace.scores, axis=-1), bert_pair_trace.weights, atol=1e-5)
    np.testing.assert_allclose(bert_pair_trace.weights.sum(-1), 1.0, atol=1e-5)


def test_custom_causal_trace_masks_the_future():
    t = build_trace(TraceRequest("custom", DEFAULT_TEXT_A, DEFAULT_TEXT_B, causal=True, **SMALL))
    upper = np.triu(np.ones((13, 13), dtype=bool), 1)
    assert (t.mask == ~upper).all()
    ms = t.masked_scores
    assert np.isneginf(ms[..., upper]).all() and np.isfinite(ms[..., ~upper]).all()
    assert (t.weights[..., upper] == 0).all()
    np.testing.assert_allclose(t.weights.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(softmax(ms, axis=-1), t.weights, atol=1e-5)
    assert t.masked_scores[1, 2, 0, 1] == -np.inf


def test_custom_trace_is_deterministic_per_seed():
    a = build_trace(TraceRequest("custom", "hello world", seed=3, **SMALL))
    b = build_trace(TraceRequest("custom", "hello world", seed=3, **SMALL))
    c = build_trace(TraceRequest("custom", "hello world", seed=4, **SMALL))
    assert np.array_equal(a.weights, b.weights)
    assert not np.array_equal(a.weights, c.weights)
    assert a.logits.shape == (2,)


def test_trace_arrays_are_read_only(bert_pair_trace):
    with pytest.raises(ValueError):
        bert_pair_trace.weights[0, 0, 0, 0] = 1.0


def test_out_of_range_head_gives_a_clear_error(bert_pair_trace):
    with pytest.raises(ValueError, match="layers 0-5"):
        bert_pair_trace.head_scores(6, 0)


@pytest.mark.parametrize("text", ["", "   ", "\u200b\u200b", "\x00\x01"])
def test_empty_text_is_refused(text):
    with pytest.raises(InputError, match="empty"):
        encode(load_tokenizer(), text)


def test_too_many_tokens_gives_the_count_unless_truncating():
    tok = load_tokenizer()
    text = "word " * 600
    with pytest.raises(InputError, match=r"602 tokens; the limit is 512"):
        encode(tok, text, max_tokens=512)
    enc = encode(tok, text, max_tokens=512, truncate=True)
    assert enc.input_ids.shape[1] == 512 and enc.truncated and enc.tokens[-1] == "[SEP]"


def test_512_tokens_trace_on_bert():
    t = build_trace(TraceRequest("bert", "word " * 510))
    assert t.n_tokens == 512
    np.testing.assert_allclose(t.weights[-1].sum(-1), 1.0, atol=1e-4)


def test_odd_unicode_traces():
    t = build_trace(TraceRequest("bert", "😀 東京 مرحبا <script>alert(1)</script>"))
    assert t.n_tokens > 5 and "<" in t.tokens


def test_empty_sentence_b_means_single_sentence():
    t = build_trace(TraceRequest("custom", "hello there", "   ", **SMALL))
    assert t.sentence_b_start is None and set(t.token_type_ids) == {0}


def test_trace_nbytes_counts_arrays(bert_pair_trace):
    assert bert_pair_trace.nbytes > bert_pair_trace.weights.nbytes


def test_value_norms_equal_a_naive_loop_over_heads(bundled, bert_pair_trace):
    t = bert_pair_trace
    for layer in (0, 5):
        w_o = bundled.model.encoder.layer[layer].attention.output.dense.weight.detach().numpy()
        for head in (0, 7):
            block = w_o[:, head * t.d_head:(head + 1) * t.d_head]  # (hidden, d_head)
            naive = [float(np.linalg.norm(block @ t.values[layer, head, j])) for j in range(t.n_tokens)]
            np.testing.assert_allclose(t.value_norms[layer, head], naive, rtol=1e-4, atol=1e-5)
