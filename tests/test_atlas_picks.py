"""Which of a head's top contexts the atlas splits (``model_core.atlas.picks``): the first ones, or ones chosen so
that fewer texts serve every head; and an atlas run with the shared rule, whose card's QK means equal ``model_core.qk``'s
split at the contexts its card names by rank."""

from __future__ import annotations

import numpy as np
import pytest

from model_core.atlas import AtlasOptions, run_atlas
from model_core.atlas.picks import qk_picks
from model_core.atlas.why import explain
from test_atlas import CORPUS, _encoded, _qk_reference, decoder  # noqa: F401 - the module's fixture, shared

LISTS = {(0, 0): [1, 2, 3], (0, 1): [4, 2, 3], (1, 0): [5, None, 3, 2], (1, 1): [None, None], (1, 2): [6]}


def _texts(lists, picks):
    return {lists[lh][r] for lh, ranks in picks.items() for r in ranks}


def test_first_takes_each_heads_first_contexts_past_the_ones_it_may_not_split():
    picks = qk_picks(LISTS, 2, "first")
    assert picks == {(0, 0): [0, 1], (0, 1): [0, 1], (1, 0): [0, 2], (1, 2): [0]}
    assert qk_picks(LISTS, 0, "first") == {} == qk_picks(LISTS, 0, "shared")


def test_shared_keeps_each_heads_best_context_and_traces_fewer_texts():
    first, shared = qk_picks(LISTS, 2, "first"), qk_picks(LISTS, 2, "shared")
    assert set(shared) == set(first)
    for lh, ranks in shared.items():
        assert ranks[0] == first[lh][0]  # the head's best context is always split
        assert len(ranks) == len(first[lh]) and ranks == sorted(set(ranks))
        assert all(LISTS[lh][r] is not None for r in ranks)
    # first: texts 1, 2, 4, 5, 3 and 6; shared: the best contexts' 1, 4, 5, 6, then text 2, which all three heads
    # still short of 2 contexts have (3 ties with it: the earlier text wins)
    assert _texts(LISTS, first) == {1, 2, 3, 4, 5, 6}
    assert _texts(LISTS, shared) == {1, 2, 4, 5, 6}
    assert shared == {(0, 0): [0, 1], (0, 1): [0, 1], (1, 0): [0, 3], (1, 2): [0]}


def test_shared_prefers_texts_another_heads_best_context_already_names():
    lists = {(0, 0): [1, 7, 8], (0, 1): [2, 9, 1]}
    assert qk_picks(lists, 2, "shared") == {(0, 0): [0, 1], (0, 1): [0, 2]}  # (0, 1) takes text 1: traced already


def test_auto_is_first_until_the_first_contexts_name_too_many_texts(monkeypatch):
    import model_core.atlas.picks as picks

    assert qk_picks(LISTS, 2) == qk_picks(LISTS, 2, "first")  # 6 texts: few enough
    monkeypatch.setattr(picks, "AUTO_SHARED_FROM", 5)
    assert qk_picks(LISTS, 2) == qk_picks(LISTS, 2, "shared") != qk_picks(LISTS, 2, "first")


def test_an_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="--qk-pick must be one of auto, first, shared"):
        qk_picks(LISTS, 2, "best")
    with pytest.raises(ValueError, match="--qk-pick"):
        AtlasOptions(qk_pick="best")


def test_a_shared_atlas_splits_the_contexts_its_card_names(decoder, tmp_path):  # noqa: F811 - the fixture
    loaded = decoder["loaded"]
    run = run_atlas(CORPUS, decoder["model"], tmp_path / "shared", loaded=loaded,
                    options=AtlasOptions(batch_size=4, chunk_size=4, qk_contexts=2, qk_pick="shared"))
    assert run.manifest["options"]["qk_pick"] == "shared"
    checked = 0
    for layer, head in ((run.shape[0] - 1, 1), (0, 0)):
        card = run.card(layer, head)
        ranks = card["qk_context_ranks"]
        assert ranks[0] == 0 and len(ranks) == card["qk_contexts"] == 2
        contexts = [(c["text_id"], c["query"], c["key"]) for c in (card["top_contexts_no_sink"][r] for r in ranks)]
        texts = _encoded(loaded, {t for t, _, _ in contexts})
        got = explain(loaded, texts, {(layer, head): contexts}, effects=False)[0][(layer, head)]
        query_side, key_side = _qk_reference(loaded, texts, contexts, layer, head)
        np.testing.assert_allclose(got.query_side, query_side, atol=1e-5)
        np.testing.assert_allclose(got.key_side, key_side, atol=1e-5)
        top = int(np.argmax(got.key_side))  # the card's top key-side component is the mean's
        assert card["qk"]["key_side"][0] == [got.components[top], pytest.approx(got.key_side[top] / got.key_side.sum(),
                                                                                 rel=1e-6)]
        checked += 1
    assert checked == 2
