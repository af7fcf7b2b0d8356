"""One word, two contexts: occurrences, common support, JS divergence, hidden-state cosine."""

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon

from model_core.analysis._common import js_divergence
from model_core.analysis.contexts import (
    CATEGORY_BINS,
    WordSpan,
    bin_assignment,
    compare_contexts,
    compare_word,
    find_occurrences,
    repeated_words,
    support_bins,
    text_words,
)
from synthetic import synthetic_trace

BANK = ("[CLS]", "the", "bank", "##er", "'", "s", "bank", "vault", "by", "the", "river", "bank", "##er", "[SEP]")


def test_find_occurrences_in_default_pair():
    trace = synthetic_trace(13, 2, 2, seed=0)
    spans = find_occurrences(trace, "Flies")
    assert spans == (WordSpan("flies", 2, 3, "a"), WordSpan("flies", 8, 9, "b"))


def test_text_words_join_wordpiece_subtokens():
    trace = synthetic_trace(tokens=BANK, n_layers=1, n_heads=1)
    words = [(s.word, s.start, s.end) for s in text_words(trace)]
    assert words[1] == ("banker", 2, 4)
    assert find_occurrences(trace, "banker") == (WordSpan("banker", 2, 4, "a"), WordSpan("banker", 11, 13, "a"))
    assert [s.start for s in find_occurrences(trace, "bank")] == [6]


def test_repeated_words_lists_words_not_punctuation():
    trace = synthetic_trace(13, 1, 1)
    assert repeated_words(trace) == ("flies", "like")
    bank = synthetic_trace(tokens=("[CLS]", "a", ",", "b", ",", "a", "[SEP]"), n_layers=1, n_heads=1)
    assert repeated_words(bank) == ("a",)


def test_empty_word_is_rejected_with_a_hint():
    with pytest.raises(ValueError, match="Give a word"):
        find_occurrences(synthetic_trace(13, 1, 1), "  ")


def test_category_bins_hand_worked_for_flies_in_sentence_a():
    trace = synthetic_trace(13, 1, 1)
    bins = bin_assignment(trace, WordSpan("flies", 2, 3, "a"), "categories")
    names = [CATEGORY_BINS[b] for b in bins]
    assert names == [
        "[CLS]", "previous", "self", "next", "own sentence", "own sentence", "[SEP]",
        "other sentence", "other sentence", "other sentence", "other sentence", "other sentence", "[SEP]",
    ]  # fmt: skip


def test_offset_bins_hand_worked_for_a_split_word():
    trace = synthetic_trace(tokens=BANK, n_layers=1, n_heads=1)
    bins = support_bins("offsets", window=2)
    assert bins == ("[CLS]", "[SEP]", "< -2", "-2", "-1", "self", "+1", "+2", "> +2")
    names = [bins[b] for b in bin_assignment(trace, WordSpan("banker", 2, 4, "a"), "offsets", window=2)]
    assert names == ["[CLS]", "-1", "self", "self", "+1", "+2"] + ["> +2"] * 7 + ["[SEP]"]


def test_js_divergence_hand_worked_values():
    assert js_divergence(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(1.0)
    assert js_divergence(np.array([0.3, 0.7]), np.array([0.3, 0.7])) == pytest.approx(0.0, abs=1e-12)
    # m = (0.75, 0.25); KL(p||m) = 0.5 log2(2/3) + 0.5 log2(2) ; KL(q||m) = log2(4/3)
    expected = 0.5 * (0.5 * np.log2(2 / 3) + 0.5) + 0.5 * np.log2(4 / 3)
    assert js_divergence(np.array([0.5, 0.5]), np.array([1.0, 0.0])) == pytest.approx(expected)
    assert np.isnan(js_divergence(np.zeros(3), np.ones(3)))


def test_js_divergence_matches_scipy_on_random_rows():
    rng = np.random.default_rng(1)
    p, q = rng.random((50, 7)), rng.random((50, 7))
    p[:5, :3] = 0.0
    expected = [jensenshannon(a, b, base=2) ** 2 for a, b in zip(p, q, strict=True)]
    np.testing.assert_allclose(js_divergence(p, q), expected, atol=1e-10)


def _naive_binned(trace, span, support, window):
    bins = support_bins(support, window)
    assignment = bin_assignment(trace, span, support, window)
    out = np.zeros((trace.n_layers, trace.n_heads, len(bins)))
    for layer in range(trace.n_layers):
        for head in range(trace.n_heads):
            for q in range(span.start, span.end):
                for k in range(trace.n_tokens):
                    out[layer, head, assignment[k]] += trace.weights[layer, head, q, k] / span.n_subtokens
    return out


@pytest.mark.parametrize("support", ["categories", "offsets"])
def test_compare_contexts_matches_naive_loops_with_subtoken_pooling(support):
    trace = synthetic_trace(tokens=BANK, n_layers=3, n_heads=2, seed=4)
    first, second = find_occurrences(trace, "banker")
    result = compare_contexts(trace, first, second, support=support, window=2)
    d1 = _naive_binned(trace, first, support, 2)
    d2 = _naive_binned(trace, second, support, 2)
    np.testing.assert_allclose(result.dist_first, d1, atol=1e-6)
    np.testing.assert_allclose(result.dist_second, d2, atol=1e-6)
    np.testing.assert_allclose(result.dist_first.sum(-1), 1.0, atol=1e-5)
    for layer in range(3):
        for head in range(2):
            ref = jensenshannon(d1[layer, head], d2[layer, head], base=2) ** 2
            assert result.js[layer, head] == pytest.approx(ref, abs=1e-8)
    for layer in range(4):
        h1 = trace.hidden_states[layer, 2:4].astype(np.float64).mean(0)
        h2 = trace.hidden_states[layer, 11:13].astype(np.float64).mean(0)
        cos = h1 @ h2 / np.linalg.norm(h1) / np.linalg.norm(h2)
        assert result.hidden_cosine[layer] == pytest.approx(cos, abs=1e-9)


def test_same_occurrence_gives_zero_divergence_and_cosine_one():
    trace = synthetic_trace(13, 2, 3, seed=2)
    span = find_occurrences(trace, "flies")[0]
    result = compare_contexts(trace, span, span)
    np.testing.assert_allclose(result.js, 0.0, atol=1e-9)
    np.testing.assert_allclose(result.hidden_cosine, 1.0, atol=1e-9)
    assert result.separation_layer is None


def test_compare_across_two_traces_uses_each_traces_positions():
    one = synthetic_trace(13, 2, 2, seed=0)
    two = synthetic_trace(13, 2, 2, seed=5)
    span = find_occurrences(one, "flies")[1]
    result = compare_contexts(one, span, span, second_trace=two)
    assert result.js.shape == (2, 2) and np.all(result.js > 0)
    with pytest.raises(ValueError, match="same model"):
        compare_contexts(one, span, span, second_trace=synthetic_trace(13, 3, 2))


def test_compare_word_needs_two_occurrences_and_names_candidates():
    trace = synthetic_trace(13, 1, 1)
    with pytest.raises(ValueError, match="flies, like"):
        compare_word(trace, "arrow")
    assert compare_word(trace, "flies").second.start == 8
