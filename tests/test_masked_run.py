"""The lean masked run of the head-masking page gives the same comparison as a full second trace."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model_core import TraceRequest, build_trace
from model_core.analysis import compare_masking, head_mask_from_off, next_token_effect, next_token_probs
from model_core.analysis.masked_run import run_masked
from model_core.analysis.masking import attention_change
from model_core.trace.request import Models

TEXT = "the old tree near the river, and the children who play there every day"


def _requests(kind: str, tiny_decoders):
    if kind == "custom":
        return TraceRequest("custom", TEXT, num_hidden_layers=2, num_attention_heads=4, hidden_size=32)
    return TraceRequest("pretrained", TEXT, model_id=str(tiny_decoders[kind]))


@pytest.mark.parametrize("kind", ["llama", "gpt2", "custom"])
def test_a_masked_run_compares_as_a_masked_trace_does(tiny_decoders, kind):
    request = _requests(kind, tiny_decoders)
    baseline = build_trace(request, device="cpu")
    mask = head_mask_from_off(baseline.n_layers, baseline.n_heads, [(0, 1), (1, 3)])
    full = build_trace(TraceRequest(**{**request.__dict__, "head_mask": tuple(map(tuple, mask.tolist()))}),
                       device="cpu")
    lean = run_masked(request, baseline, mask, device="cpu")
    assert not hasattr(lean, "weights")  # compared as it ran, not kept
    tv, js = attention_change(baseline.weights, full.weights, baseline.mask)
    np.testing.assert_allclose(lean.attention_tv, tv, atol=1e-6)
    np.testing.assert_allclose(lean.attention_js, js, atol=1e-6)
    # layer 1 moved; in layer 0 only the switched-off head did (its weights are zeroed, blanked by compare_masking)
    assert (lean.attention_tv[1] > 1e-4).any() and not lean.attention_tv[0, [0, 2, 3]].any()
    a, b = compare_masking(baseline, full), compare_masking(baseline, lean)
    for name in ("cls_cosine", "cls_l2", "attention_tv", "attention_js"):
        np.testing.assert_allclose(getattr(b, name), getattr(a, name), atol=1e-6, equal_nan=True, err_msg=name)
    assert b.first_masked_layer == 0 and np.isnan(b.attention_tv[1, 3])
    if kind == "custom":
        np.testing.assert_allclose(b.logits_masked, a.logits_masked, atol=1e-6)
        return
    loaded = Models().pretrained(request.model_id, torch.device("cpu"))
    p = next_token_probs(loaded.family, loaded.model, baseline)
    via_trace = next_token_effect(baseline, full, p, next_token_probs(loaded.family, loaded.model, full))
    via_run = next_token_effect(baseline, lean, p, lean.next_token_probs)
    np.testing.assert_allclose(via_run.masked, via_trace.masked, atol=1e-6)
    assert via_run.strings == via_trace.strings
    assert via_run.total_variation == pytest.approx(via_trace.total_variation, abs=1e-6)
    assert lean.top_ids[0] == int(np.argmax(lean.next_token_probs))
