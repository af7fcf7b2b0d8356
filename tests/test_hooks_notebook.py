"""The notebook's hook verbs: ``ae.run_with_cache`` and ``ae.run_with_hooks`` on SmolLM2 and BERT, a long prompt's
compact pass, and ``Trace.qk``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attention_explorer as ae
from attention_explorer.hooks import add, patch
from model_core.models.loading import load_pretrained
from model_core.settings import BUNDLED_DECODER_ID

TEXT = "The cat sat on the mat. The cat sat on the"


@pytest.mark.slow
def test_run_with_cache_reads_points_by_name_as_transformers_computes_them():
    cache = ae.run_with_cache(TEXT, names=["blocks.2.hook_resid_post", "blocks.2.attn.hook_pattern",
                                           "blocks.2.attn.hook_k"], model=BUNDLED_DECODER_ID)
    loaded = load_pretrained(BUNDLED_DECODER_ID, device="cpu")
    ids = loaded.tokenizer(TEXT, return_tensors="pt").input_ids  # no BOS, no template
    assert cache.tokens == loaded.tokenizer.convert_ids_to_tokens(ids[0].tolist())
    with torch.no_grad():
        ref = loaded.model(ids, output_hidden_states=True, output_attentions=True)
    torch.testing.assert_close(cache["blocks.2.hook_resid_post"], ref.hidden_states[3], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache["blocks.2.attn.hook_pattern"], ref.attentions[2], atol=1e-5, rtol=1e-5)
    assert cache["blocks.2.attn.hook_k"].shape == (1, ids.shape[1], 3, 64)  # SmolLM2: 3 key/value heads
    with pytest.raises(KeyError, match="was not cached"):
        cache["blocks.0.hook_resid_pre"]


@pytest.mark.slow
def test_run_with_hooks_writes_a_point_and_a_patch_with_its_own_value_changes_nothing():
    name = "blocks.5.attn.hook_z"
    clean = ae.run_with_cache(TEXT, names=[name], model=BUNDLED_DECODER_ID)
    same = ae.run_with_hooks(TEXT, hooks=[(name, patch(clean[name]))], model=BUNDLED_DECODER_ID)
    assert torch.equal(same.logits, clean.logits)
    zeroed = ae.run_with_hooks(TEXT, hooks=[(name, lambda z, hook: z * 0)], names=[name], model=BUNDLED_DECODER_ID)
    assert float(zeroed[name].abs().max()) == 0.0 and not torch.equal(zeroed.logits, clean.logits)
    nudged = ae.run_with_hooks(TEXT, hooks=[("blocks.3.hook_resid_pre", add(torch.ones(576), positions=[2]))],
                               names=["blocks.3.hook_resid_pre"], model=BUNDLED_DECODER_ID)
    diff = (nudged.logits - clean.logits).abs().amax(dim=-1)[0]
    assert float(diff[:2].max()) == 0.0 and float(diff[2:].min()) > 0  # causal: only position 2 on changes


def test_every_point_of_bert_is_cached_by_default():
    cache = ae.run_with_cache("time flies like an arrow")
    assert set(cache) == set(ae.hook_points())
    assert "hook_token_type_embed" in cache and "ln_final.hook_scale" not in cache  # BERT has no final norm


@pytest.mark.slow
def test_a_long_prompt_serves_every_point_but_the_pattern():
    text = " ".join(["the lighthouse keeper counted herons"] * 240)
    cache = ae.run_with_cache(text, names=lambda n: n.startswith("blocks.1."), model=BUNDLED_DECODER_ID)
    assert cache.compact and len(cache.tokens) >= 1024
    assert "blocks.1.attn.hook_q" in cache and "blocks.1.attn.hook_pattern" not in cache
    with pytest.raises(ValueError, match="n x n pattern"):
        ae.run_with_cache(text, names=["blocks.1.attn.hook_pattern"], model=BUNDLED_DECODER_ID)


@pytest.mark.slow
def test_trace_qk_splits_the_score_with_its_figures():
    t = ae.trace(TEXT, model=BUNDLED_DECODER_ID)
    qk = t.qk(3, 2, row=True)
    assert abs(float(qk.terms.sum()) - qk.result.score) <= 1e-5 * max(1.0, abs(qk.result.score))
    assert len(qk.terms_figure().data) == 1 and qk.row_figure() is not None
    assert "score" in repr(qk)
    np.testing.assert_allclose(qk.result.row[:, qk.result.row_keys.index(qk.result.key)], qk.result.key_side,
                               atol=1e-6)
