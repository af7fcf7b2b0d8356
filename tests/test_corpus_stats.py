"""Corpus statistics: the batched path against a naive loop over today's one-text head_stats; shards merge."""

from __future__ import annotations

import numpy as np
import pytest

from model_core import TraceRequest, build_trace
from model_core.analysis.per_head import STAT_NAMES, head_stats
from model_core.corpus import Corpus, CorpusModel, PatternRules, RunOptions, StatSums, pattern_types, run_corpus

TEXTS = (
    ("time flies like an arrow", "fruit flies like a banana"),
    ("We sat on the river bank, and watched the boats.", None),
    ("The bank raised its rates!", None),
    ("Hi", None),
    ("Unbelievably, photosynthesis never stops; it is remarkable.", "Yes."),
    ("a b c d e f g h i j k l m n o p q r s t u v w x y z", None),
)
SMALL = dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=64)


def _naive(kind: str, **options) -> np.ndarray:
    """(text, stat, layer, head) from one trace per text, as the Head statistics page computes them."""
    rows = []
    for a, b in TEXTS:
        stats = head_stats(build_trace(TraceRequest(kind, a, b, **options), device="cpu")).to_dict()
        rows.append(np.stack([stats[name] for name in STAT_NAMES]))
    return np.array(rows)


@pytest.mark.parametrize("kind,options", [
    ("bert", {}),
    ("custom", {**SMALL, "causal": True, "seed": 3}),
    ("custom", {**SMALL, "norm_placement": "post"}),
    ("pretrained", {"model_id": "gpt2"}),
    ("pretrained", {"model_id": "llama"}),
], ids=["bundled-bert", "custom-causal", "custom-post-ln", "tiny-gpt2", "tiny-llama-bos"])
def test_corpus_mean_and_std_equal_a_naive_loop_of_head_stats(tmp_path, kind, options, tiny_decoders):
    if kind == "pretrained":  # a decoder: first-token share, right padding under the causal mask
        options = {"model_id": str(tiny_decoders[options["model_id"]])}
    model = CorpusModel.from_options(kind, **options)
    # batch 4 and shards of 4: padded batches of mixed lengths, pairs beside singles, two shards
    run = run_corpus(Corpus("t", TEXTS), model, tmp_path / "run", options=RunOptions(batch_size=4, chunk_size=4),
                     device="cpu")
    naive = _naive(kind, **options)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(run.mean, np.nanmean(naive, axis=0), atol=2e-6, equal_nan=True)
        np.testing.assert_allclose(run.std, np.nanstd(naive, axis=0), atol=2e-6, equal_nan=True)
    counts = np.isfinite(naive).sum(0)
    np.testing.assert_array_equal(run.count, counts)
    assert run.count[STAT_NAMES.index("a_to_b")].max() == 2  # only the two pairs define A→B
    for text_id in range(len(TEXTS)):  # each text's own row, too
        ids, values = run.per_text("entropy", 1, 2)
        assert values[list(ids).index(text_id)] == pytest.approx(naive[text_id, 0, 1, 2], abs=2e-6)


def test_merging_shards_equals_one_pass():
    rng = np.random.default_rng(0)
    values = rng.random((50, len(STAT_NAMES), 3, 4))
    values[::3, -2:] = np.nan  # single sentences: no A→B / B→A
    whole = StatSums.zeros(3, 4)
    whole.add(values)
    parts = [StatSums.zeros(3, 4) for _ in range(3)]
    for part, chunk in zip(parts, np.array_split(values, 3)):
        part.add(chunk)
    merged = parts[2].merge(parts[0]).merge(parts[1])  # any order
    np.testing.assert_allclose(merged.mean(), whole.mean(), rtol=1e-12)
    np.testing.assert_allclose(merged.std(), whole.std(), rtol=1e-9)
    np.testing.assert_array_equal(merged.count, whole.count)
    assert merged.n_texts == 50
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(whole.mean(), np.nanmean(values, 0), rtol=1e-12)
        np.testing.assert_allclose(whole.std(), np.nanstd(values, 0), rtol=1e-9)


def test_merge_refuses_shards_of_another_shape():
    with pytest.raises(ValueError, match="different models"):
        StatSums.zeros(2, 4).merge(StatSums.zeros(6, 12))


def _mean_with(**stats) -> np.ndarray:
    mean = np.zeros((len(STAT_NAMES), 1, 1))
    for name, value in stats.items():
        mean[STAT_NAMES.index(name)] = value
    return mean


@pytest.mark.parametrize("stats,expected", [
    ({"to_cls": 0.3, "to_sep": 0.25, "a_to_b": 0.3, "b_to_a": 0.3}, "vertical"),
    ({"to_prev": 0.4, "to_self": 0.2, "a_to_b": 0.3, "b_to_a": 0.3}, "diagonal"),
    ({"to_cls": 0.1, "a_to_b": 0.05, "b_to_a": 0.08}, "block"),
    ({"to_cls": 0.1, "a_to_b": 0.3, "b_to_a": 0.3}, "heterogeneous"),
    ({"to_cls": 0.1, "a_to_b": np.nan, "b_to_a": np.nan}, "heterogeneous"),  # no pairs: never block
    ({"to_sep": 0.6, "to_prev": 0.6}, "vertical"),  # the first rule that holds wins
])
def test_pattern_rules(stats, expected):
    assert pattern_types(_mean_with(**stats))[0, 0] == expected


def test_pattern_thresholds_are_the_rules():
    mean = _mean_with(to_cls=0.35, a_to_b=np.nan, b_to_a=np.nan)
    assert pattern_types(mean, PatternRules(vertical=0.3))[0, 0] == "vertical"
    assert pattern_types(mean, PatternRules(vertical=0.4))[0, 0] == "heterogeneous"
    with pytest.raises(ValueError, match="between 0 and 1"):
        PatternRules(block=1.5)
