"""The head atlas on long texts (``LONG_FROM`` tokens or more): scanned alone through the compact pass, and their
contexts split, and their direct effects taken, from ``model_core.atlas.long_arrays``'s pass (no n x n weights),
equal to ``model_core.qk``'s own split and to the full trace's effects. The tiny models read 128 tokens, so "long"
is lowered to 100 here."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from test_atlas import OPTIONS, TEXTS, _qk_reference, decoder  # noqa: F401 - the fixture

from model_core.atlas import run_atlas
from model_core.atlas.long_arrays import long_text_arrays, values_of
from model_core.atlas.why import direct_effects, explain, text_arrays
from model_core.corpus import Corpus, CorpusModel
from model_core.corpus.batches import encode_texts
from model_core.families.weights import layer_weights

LONG_TEXT = " ".join(["the cat sat on the mat and the dog ran to the door"] * 100)


def _with_norms(loaded):
    """The model with every norm's gain (and bias) drawn at random: a freshly built one has gains of 1 and biases of
    0, which would let a norm left out of the long pass go unseen. A copy: the fixtures' model is shared."""
    module = copy.deepcopy(loaded.module)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if "norm" in name or ".ln_" in name:
                parameter.copy_(torch.rand(parameter.shape, generator=generator) + 0.5)
    return dataclasses.replace(loaded, module=module)


def _long(loaded):
    return encode_texts(loaded.tokenizer, [(LONG_TEXT, None)], 0, 128, "truncate", loaded.family)[0][0]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_long_pass_equals_the_full_trace(family, tiny_decoders):
    """Each head's output z, the values taken from the layer's input, the queries, keys and residual stream of
    ``long_text_arrays`` equal the full trace's (weights @ values)."""
    loaded = _with_norms(CorpusModel("pretrained", str(tiny_decoders[family])).load("cpu"))
    text = _long(loaded)
    (_, full), = list(text_arrays(loaded, [text]))
    long = long_text_arrays(loaded, text, block=48)  # blocks that do not divide the 128 positions
    assert long.z.shape == full.queries.shape and len(text.ids) == 128
    np.testing.assert_allclose(long.z, full.weights @ full.values, atol=1e-5)
    np.testing.assert_allclose(long.queries, full.queries, atol=1e-5)
    for head in range(full.queries.shape[1]):
        np.testing.assert_allclose(long.keys[1, head], full.keys[1, head], atol=1e-5)
    np.testing.assert_allclose(long.hidden_states, full.hidden_states, atol=1e-5)
    kv = np.asarray(loaded.family.kv_heads(loaded.module.config))
    for layer, lw in enumerate(layer_weights(loaded.module)):
        v = values_of(lw, torch.from_numpy(full.hidden_states[layer])).numpy()[kv]
        np.testing.assert_allclose(v, full.values[layer], atol=1e-5)


def test_a_long_texts_split_and_effects_equal_qks_and_the_full_traces(decoder):  # noqa: F811 - the fixture
    loaded = _with_norms(decoder["loaded"])
    text = _long(loaded)
    layer, head = 1, 1
    contexts = [(0, 127, 64), (0, 90, 3), (0, 60, 59)]
    wanted = {(layer, head): contexts, (0, 2): [(0, 100, 99)]}
    averages, effects = explain(loaded, {0: text}, wanted, long_from=100)
    full_averages, full_effects = explain(loaded, {0: text}, wanted)  # the same text traced in full
    got = averages[(layer, head)]
    query_side, key_side = _qk_reference(loaded, {0: text}, contexts, layer, head)
    np.testing.assert_allclose(got.query_side, query_side, atol=1e-5)
    np.testing.assert_allclose(got.key_side, key_side, atol=1e-5)
    for lh in wanted:
        np.testing.assert_allclose(averages[lh].key_side, full_averages[lh].key_side, atol=1e-5)
        np.testing.assert_allclose(averages[lh].query_side, full_averages[lh].query_side, atol=1e-5)
        np.testing.assert_allclose(effects[lh], full_effects[lh], atol=1e-4, rtol=1e-5)
    (_, long), = list(text_arrays(loaded, [text], long_from=100))
    (_, full), = list(text_arrays(loaded, [text]))
    np.testing.assert_allclose(direct_effects(loaded, long, [(1, 1, 127)]), direct_effects(loaded, full, [(1, 1, 127)]),
                               atol=1e-4, rtol=1e-5)


def test_a_long_text_runs_through_the_atlas_and_its_contexts_are_split(decoder, tmp_path,  # noqa: F811
                                                                       monkeypatch):
    """A long text beside the short ones: scanned alone through the compact pass, its contexts on the cards, and the
    QK split taken at every head's first contexts, the long text's included."""
    import model_core.atlas.run as atlas_run
    import model_core.atlas.shard as shard

    monkeypatch.setattr(shard, "LONG_FROM", 100)
    # the card pass runs a decoder's text only up to its contexts' last query (``why._up_to_queries``): the long text
    # is cut there (its contexts are early ones here), and still takes the long route: from 5 tokens, as every text
    monkeypatch.setattr(atlas_run, "LONG_FROM", 5)
    corpus = Corpus("long", (*TEXTS, (LONG_TEXT, None)))
    seen, passes = [], []
    original = shard.long_text_scan
    monkeypatch.setattr(shard, "long_text_scan", lambda *a, **k: seen.append(a[1].shape[1]) or original(*a, **k))
    import model_core.atlas.why as why

    original_arrays = why.long_text_arrays
    monkeypatch.setattr(why, "long_text_arrays", lambda *a, **k: passes.append((a[1].text_id, len(a[1].ids))) or
                        original_arrays(*a, **k))
    run = run_atlas(corpus, decoder["model"], tmp_path / "long", options=OPTIONS, loaded=decoder["loaded"])
    assert seen == [128]  # the long text alone, truncated to the model's 128 positions
    cards = [run.card(layer, head) for layer in range(run.shape[0]) for head in range(run.shape[1])]
    in_long = [c for c in cards if any(x["text_id"] == len(TEXTS) for x in c["top_contexts_no_sink"][:2])]
    long_passes = [n for text_id, n in passes if text_id == len(TEXTS)]
    assert in_long and len(long_passes) == 1 and 5 <= long_passes[0] < 128, passes  # its card pass ran, cut
    for card in cards:
        assert card["qk_contexts"] == min(OPTIONS.qk_contexts, len(card["top_contexts_no_sink"]))
        assert card["qk"] is not None and card["promoted_tokens"]


def test_the_split_in_chunks_of_one_context_equals_one_chunk(decoder, monkeypatch):  # noqa: F811 - the fixture
    """``TextSplit.split_many`` takes the contexts in layer order and in chunks that fit its byte budget; a budget
    of one byte (a chunk a context) gives every context the same split as one chunk for all."""
    from model_core.atlas.qk_fast import TextSplit

    loaded = _with_norms(decoder["loaded"])
    text = _long(loaded)
    wanted = {(1, 1): [(0, 127, 64), (0, 60, 59)], (0, 2): [(0, 100, 99)], (1, 0): [(0, 20, 3)]}
    together, _ = explain(loaded, {0: text}, wanted, effects=False, long_from=100)
    monkeypatch.setattr(TextSplit, "CHUNK_BYTES", 1)
    apart, _ = explain(loaded, {0: text}, wanted, effects=False, long_from=100)
    for lh in wanted:
        np.testing.assert_allclose(apart[lh].query_side, together[lh].query_side, atol=1e-12)
        np.testing.assert_allclose(apart[lh].key_side, together[lh].key_side, atol=1e-12)


def test_a_decoders_card_pass_cut_at_the_last_query_splits_and_reads_as_the_whole_text(decoder,  # noqa: F811
                                                                                         monkeypatch):
    """A decoder's text runs for its card only up to its contexts' last query (``why._up_to_queries``); under the
    causal mask that changes no split and no direct effect, against the whole text's pass."""
    import model_core.atlas.why as why

    loaded = decoder["loaded"]
    text = _long(loaded)
    wanted = {(1, 1): [(0, 40, 12)], (0, 2): [(0, 25, 24)], (1, 0): [(0, 20, 3)]}
    cut_to: list[int] = []
    original = why._up_to_queries
    monkeypatch.setattr(why, "_up_to_queries", lambda *a: cut_to.append(len(original(*a).ids)) or original(*a))
    cut, cut_effects = explain(loaded, {0: text}, wanted)
    assert cut_to == [41]
    monkeypatch.setattr(why, "_up_to_queries", lambda text, items, causal: text)
    whole, whole_effects = explain(loaded, {0: text}, wanted)
    for lh in wanted:
        np.testing.assert_allclose(cut[lh].query_side, whole[lh].query_side, atol=1e-5)
        np.testing.assert_allclose(cut[lh].key_side, whole[lh].key_side, atol=1e-5)
        np.testing.assert_allclose(cut_effects[lh], whole_effects[lh], atol=1e-4, rtol=1e-5)
