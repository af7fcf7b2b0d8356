"""Each KV-cache policy's kept set, retained shares and next-token KL equal an independent reimplementation from
the paper's definition (tests/kv_reference.py: plain eager transformers, explicit loops, a cache-free masked run)
on tiny GPT-2, Llama (grouped-query) and Qwen2 models; and the last token keeps its true position."""

from __future__ import annotations

import functools

import kv_reference as ref_kv
import numpy as np
import pytest
import torch
from tiny_models import CORPUS

from model_core.generate.kv import compress, compressed_log_probs, plan_kv
from model_core.generate.presses import PRESSES, kept_positions, n_kept
from model_core.models.loading import load_pretrained

FAMILIES = ("gpt2", "llama", "qwen2")
N_TOKENS = 120  # the tiny models have 128 positions; SnapKV's 64-query window fits with 55 keys to score
RATIOS = (0.3, 0.75)  # 0.3 keeps more keys than SnapKV's window, 0.75 fewer


@functools.cache
def _setup(folder: str, n_tokens: int = N_TOKENS):
    loaded = load_pretrained(folder)
    ids = np.array(loaded.tokenizer(CORPUS).input_ids[:n_tokens])
    assert len(ids) == n_tokens
    plan = plan_kv(loaded.family, loaded.model, ids)
    return loaded, ids, plan, ref_kv.eager_reference(folder, ids)


@pytest.fixture(params=FAMILIES)
def tiny(request, tiny_decoders):
    return _setup(str(tiny_decoders[request.param]))


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("press", PRESSES)
def test_kept_set_equals_the_definition(tiny, press, ratio):
    loaded, ids, plan, ref = tiny
    result = compress(plan, loaded.family, loaded.model, press, ratio)
    expected = ref_kv.kept_sets(ref, press, ratio)
    assert result.n_kept == ref_kv.n_kept(len(ids) - 1, ratio)
    assert result.kept.tolist() == expected


def test_knorm_is_not_recency(tiny):
    """A check that the definitions differ on these models (so the tests above can fail)."""
    _, _, plan, ref = tiny
    sets = {p: ref_kv.kept_sets(ref, p, 0.5) for p in PRESSES}
    assert len({str(s) for s in sets.values()}) == len(PRESSES)


@pytest.mark.parametrize("press", PRESSES)
def test_retained_shares_and_kl_equal_a_plain_eager_computation(tiny, press):
    loaded, ids, plan, ref = tiny
    result = compress(plan, loaded.family, loaded.model, press, 0.5)
    kept = result.kept.tolist()
    np.testing.assert_allclose(result.retained, ref_kv.retained(ref, kept), atol=1e-5)
    log_p, log_q = ref_kv.masked_log_probs(ref, None), ref_kv.masked_log_probs(ref, kept)
    assert result.next_token_kl == pytest.approx(ref_kv.kl(log_p, log_q), abs=1e-5)
    assert result.top_full == int(np.argmax(log_p)) and result.top_compressed == int(np.argmax(log_q))
    assert ((result.retained > 0) & (result.retained < 1)).all()  # the last token's own key is not counted


def test_the_last_token_keeps_its_true_position(tiny):
    """The compressed run equals the masked reference; at the cache's length as its position it would not."""
    loaded, ids, plan, ref = tiny
    kept = kept_positions(plan.orders["knorm"], n_kept(len(ids) - 1, 0.75))
    ours = compressed_log_probs(loaded.family, loaded.model, plan.prefill, kept)
    reference = ref_kv.masked_log_probs(ref, kept.tolist())
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    wrong = _at_cache_length(loaded, plan.prefill, kept)
    assert np.abs(wrong - reference).max() > 1e-3


def _at_cache_length(loaded, pre, kept) -> np.ndarray:
    """The compressed run as transformers does it without position_ids: the last token at the cache's length."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for layer, (k, v) in enumerate(zip(pre.keys, pre.values)):
        idx = torch.from_numpy(kept[layer])[None, :, :, None].expand(1, -1, -1, k.shape[-1])
        cache.update(k.gather(2, idx), v.gather(2, idx), layer)
    ids = torch.tensor([[int(pre.token_ids[-1])]])
    out = loaded.family.forward(loaded.model, ids, torch.zeros_like(ids), None, vectors=False, hidden=False,
                                logits=True, past=cache)
    return torch.log_softmax(out.lm_logits[0, -1].double(), -1).numpy()


def test_full_cache_run_equals_the_whole_text(tiny):
    """The last token on the uncompressed cache predicts what the whole text's pass predicts."""
    loaded, ids, plan, ref = tiny
    np.testing.assert_allclose(plan.prefill.full_log_probs, ref_kv.masked_log_probs(ref, None), atol=1e-5)
    np.testing.assert_allclose(plan.prefill.last_row, ref.last_row, atol=1e-5)


@pytest.mark.parametrize("press", PRESSES)
def test_short_text_shrinks_snapkvs_window_and_still_matches(tiny_decoders, press):
    loaded, ids, plan, ref = _setup(str(tiny_decoders["llama"]), 24)
    result = compress(plan, loaded.family, loaded.model, press, 0.4)
    assert result.kept.tolist() == ref_kv.kept_sets(ref, press, 0.4)
    assert bool(result.notes) == (press == "snapkv")
