"""The analyses on real (tiny) decoders: the family's markers instead of [CLS]/[SEP], relevance to the last token,
the next-token effect of switching heads off, the unmasked mask steps, BPE words."""

from __future__ import annotations


import numpy as np
import pytest

from model_core import TraceRequest, build_trace
from model_core.analysis.aggregate import marker_positions
from model_core.analysis import (
    attention_flow,
    compare_masking,
    compare_word,
    head_mask_from_off,
    head_stats,
    markers,
    next_token_effect,
    next_token_probs,
    repeated_words,
    rollout_and_flow,
    special_token_mass,
    stat_titles,
    text_words,
)
from model_core.models.loading import load_pretrained
from model_core.analysis.mask_steps import mask_steps, softmax_rows
from synthetic import synthetic_trace

PAIR = ("time flies like an arrow", "fruit flies like a banana")


def _request(folder, text: str = PAIR[0], text_b: str = PAIR[1], **kw) -> TraceRequest:
    return TraceRequest("pretrained", text, text_b=text_b, model_id=str(folder), **kw)


@pytest.fixture(scope="module")
def traces(tiny_decoders) -> dict:
    """A pair traced by each tiny decoder family: family -> trace."""
    return {family: build_trace(_request(folder), device="cpu") for family, folder in tiny_decoders.items()}


@pytest.fixture(params=["gpt2", "llama", "gemma"])
def family(request) -> str:
    """GPT-2 (no BOS, no GQA), Llama (a BOS token, 2 kv heads), Gemma (1 kv head, its own score scale)."""
    return request.param


# -- head statistics --------------------------------------------------------------------------------
def test_first_token_share_is_the_mean_weight_of_column_0(traces, family):
    t = traces[family]
    stats = head_stats(t)
    np.testing.assert_allclose(stats.to_cls, t.weights[..., 0].astype(np.float64).mean(-1), rtol=1e-6)
    assert t.tokens[0] not in ("[CLS]", "<s>")  # the column is position 0 whatever its token is
    assert stat_titles(t)["to_cls"] == "Share to the first token"


def test_without_later_special_tokens_the_special_share_is_undefined_not_zero(traces, family):
    stats = head_stats(traces[family])
    assert np.isnan(stats.to_sep).all()
    assert stat_titles(traces[family])["to_sep"] == "Share to other special tokens"


def test_a_special_token_after_the_first_counts_as_the_decoders_sep(tiny_decoders):
    t = build_trace(_request(tiny_decoders["gpt2"], "time flies<|endoftext|> fruit flies", ""), device="cpu")
    at = t.tokens.index("<|endoftext|>")
    assert at > 0
    stats = head_stats(t)
    np.testing.assert_allclose(stats.to_sep, t.weights[..., at].astype(np.float64).mean(-1), rtol=1e-6)
    assert marker_positions(t) == [0, at]


def test_a_decoder_never_looks_ahead_so_a_to_b_is_zero(traces, family):
    stats = head_stats(traces[family])
    np.testing.assert_allclose(stats.to_next, 0.0, atol=1e-7)
    np.testing.assert_allclose(stats.a_to_b, 0.0, atol=1e-7)
    assert (stats.b_to_a > 0).all()


def test_largest_weight_leaves_out_the_first_query_which_has_no_choice(traces, family):
    t = traces[family]
    stats = head_stats(t)
    np.testing.assert_allclose(stats.max_weight, t.weights[:, :, 1:].max(axis=(-1, -2)), rtol=1e-6)
    assert (stats.max_weight < 1).any()  # with row 0, every causal head would score 1


def test_encoders_keep_cls_and_sep():
    t = synthetic_trace(10, 2, 2)
    names = markers(t)
    assert (names.first, names.sep, names.readout, names.both) == ("[CLS]", "[SEP]", 0, "[CLS]+[SEP]")
    assert stat_titles(t)["to_cls"] == "Share to [CLS]"
    assert np.isfinite(head_stats(t).to_sep).all()


# -- rollout and flow -------------------------------------------------------------------------------
def test_rollout_relevance_is_to_the_last_token(traces, family):
    t = traces[family]
    names = markers(t)
    assert (names.readout, names.readout_label) == (t.n_tokens - 1, "the last token")
    result = rollout_and_flow(t.weights, t.head_mask, target=names.readout)
    np.testing.assert_array_equal(result.target_rollout, result.rollout[-1, t.n_tokens - 1])
    assert result.target_rollout.sum() == pytest.approx(1.0)
    assert (result.target_rollout > 0).all()  # the last token sees every token
    np.testing.assert_allclose(result.target_flow,
                               attention_flow(t.weights, t.head_mask, rows=[t.n_tokens - 1])[-1])


def test_a_causal_rollout_is_a_lower_triangle(traces):
    result = rollout_and_flow(traces["llama"].weights, target=-1)
    assert np.triu(result.rollout[-1], 1).max() == 0.0
    assert result.target == traces["llama"].n_tokens - 1
    assert result.rollout[-1, 0, 0] == pytest.approx(1.0)  # the first token comes from itself alone


# -- norm-weighted attention ------------------------------------------------------------------------
def test_special_mass_names_the_first_token_and_leaves_out_absent_specials(traces, family):
    t = traces[family]
    mass = special_token_mass(t)
    assert list(mass.per_layer()) == ["raw first token", "norm-weighted first token"]
    raw = t.weights.astype(np.float64)
    np.testing.assert_allclose(mass.raw_cls, raw[..., 0].sum(-1) / raw.sum((-1, -2)), rtol=1e-6)
    weighted = raw * t.value_norms[:, :, None, :]
    np.testing.assert_allclose(mass.norm_cls, weighted[..., 0].sum(-1) / weighted.sum((-1, -2)), rtol=1e-6)


def test_grouped_query_heads_share_their_value_vectors(traces):
    t = traces["llama"]  # 4 query heads, 2 kv heads
    assert t.n_kv_heads == 2
    np.testing.assert_array_equal(t.values[:, 0], t.values[:, 1])
    assert not np.array_equal(t.values[:, 1], t.values[:, 2])


# -- head masking -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def masked_llama(tiny_decoders, traces):
    off = head_mask_from_off(2, 4, [(0, 1), (1, 3)])
    masked = build_trace(_request(tiny_decoders["llama"], head_mask=tuple(map(tuple, off.tolist()))), device="cpu")
    return load_pretrained(str(tiny_decoders["llama"]), device="cpu"), traces["llama"], masked


def test_masking_compares_the_last_tokens_hidden_state(masked_llama):
    _, t, masked = masked_llama
    effect = compare_masking(t, masked)
    assert (effect.position, effect.position_label) == (t.n_tokens - 1, "the last token")
    h1, h2 = t.hidden_states[-1, -1].astype(np.float64), masked.hidden_states[-1, -1].astype(np.float64)
    assert effect.cls_l2[-1] == pytest.approx(np.linalg.norm(h1 - h2), rel=1e-6)
    assert effect.cls_cosine[0] == pytest.approx(1.0)  # the embeddings do not change


def test_the_whole_next_token_distribution_matches_the_traces_top_predictions(masked_llama):
    loaded, t, _ = masked_llama
    probs = next_token_probs(loaded.family, loaded.model, t)
    assert probs.sum() == pytest.approx(1.0)
    k = t.next_token_ids.shape[1]
    np.testing.assert_array_equal(np.argsort(-probs)[:k], t.next_token_ids[-1])
    np.testing.assert_allclose(probs[t.next_token_ids[-1]], t.next_token_probs[-1], rtol=1e-4)


def test_next_token_effect_of_switching_heads_off(masked_llama):
    loaded, t, masked = masked_llama
    p, q = (next_token_probs(loaded.family, loaded.model, x) for x in (t, masked))
    effect = next_token_effect(t, masked, p, q)
    assert effect.position == t.n_tokens - 1
    assert effect.total_variation == pytest.approx(0.5 * np.abs(p - q).sum())
    assert effect.kl_bits == pytest.approx(float(np.sum(p * np.log2(p / q))), rel=1e-6)
    assert 0 < effect.total_variation < 1 and effect.kl_bits > 0
    assert set(t.next_token_ids[-1]) | set(masked.next_token_ids[-1]) == set(effect.token_ids.tolist())
    assert list(effect.baseline) == sorted(effect.baseline, reverse=True)
    np.testing.assert_allclose(effect.delta, q[effect.token_ids] - p[effect.token_ids])
    same = next_token_effect(t, t, p, p)
    assert same.total_variation == 0.0 and same.kl_bits == 0.0 and not same.top_changed


def test_an_encoder_has_no_next_token_effect():
    t = synthetic_trace(8, 1, 2)
    with pytest.raises(ValueError, match="decoder"):
        next_token_effect(t, t, np.ones(3) / 3, np.ones(3) / 3)


# -- mask steps -------------------------------------------------------------------------------------
def test_decoder_mask_steps_are_the_models_own(traces, family):
    t = traces[family]
    s = mask_steps(t, 1, 2)
    assert s.causal and not s.illustrative
    np.testing.assert_array_equal(s.mask, np.tril(np.ones((t.n_tokens,) * 2, dtype=bool)))
    np.testing.assert_allclose(softmax_rows(s.masked_scores), t.weights[1, 2], atol=1e-5)


def test_unmasked_steps_are_derived_from_the_same_scores_without_a_second_run(traces, family):
    t = traces[family]
    s = mask_steps(t, 1, 2, apply_causal=False)
    assert s.illustrative and not s.causal and s.mask.all()
    np.testing.assert_allclose(s.weights, softmax_rows(t.head_scores(1, 2)), atol=1e-6)
    assert (np.triu(s.weights, 1) > 0).any()  # the future now gets weight


def test_custom_encoder_causal_steps_derived_from_a_bidirectional_run_match_a_causal_run_in_layer_0():
    kw = dict(num_hidden_layers=2, num_attention_heads=2, hidden_size=16)
    bidirectional = build_trace(TraceRequest("custom", "time flies like an arrow", **kw))
    causal = build_trace(TraceRequest("custom", "time flies like an arrow", causal=True, **kw))
    derived = mask_steps(bidirectional, 0, 1, apply_causal=True)
    np.testing.assert_allclose(derived.weights, causal.weights[0, 1], atol=1e-5)
    back = mask_steps(causal, 0, 1, apply_causal=False)
    np.testing.assert_allclose(back.weights, bidirectional.weights[0, 1], atol=1e-5)


# -- one word, two contexts -------------------------------------------------------------------------
def test_bpe_words_repeat_and_the_bins_name_the_first_token(traces, family):
    t = traces[family]
    assert repeated_words(t) == ("flies", "like")
    assert all(span.word not in ("<|endoftext|>", "\n", "Ċ") for span in text_words(t))
    result = compare_word(t, "flies")
    assert result.bins[:2] == ("first token", "other special tokens")
    np.testing.assert_allclose(result.dist_first.sum(-1), 1.0, atol=1e-5)
    first = result.first
    # The first bin holds exactly column 0 of the word's rows.
    rows = t.weights[:, :, first.start:first.end, 0].astype(np.float64).mean(-1)
    np.testing.assert_allclose(result.dist_first[..., 0], rows, atol=1e-6)


def test_marker_positions_map_to_words(traces):
    t = traces["llama"]  # a BOS token at 0: a word of its own
    assert t.tokens[0] == "<|endoftext|>"
    assert marker_positions(t) == [0] and marker_positions(t, t.words()) == [0]
