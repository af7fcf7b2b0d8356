"""The bundled SmolLM2-135M (Llama, grouped-query attention): contributions sum to 1, the attention parts rebuild the
hooked resid_mid, and the compact graph equals the full one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

TEXT = "The river bank was calm in the morning, and the birds were singing in the trees by the water."


@pytest.mark.slow
def test_smollm2_contributions_rebuild_and_compact_graph():
    from model_core import TraceRequest, build_trace
    from model_core.compact.build import build_compact
    from model_core.effects.graph import build_graph
    from model_core.effects.graph_source import compact_flow, trace_flow
    from model_core.models.bundled import ensure_bundled_decoder
    from model_core.models.loading import load_pretrained
    from model_core.settings import BUNDLED_DECODER_ID

    ensure_bundled_decoder()
    loaded = load_pretrained(BUNDLED_DECODER_ID, device="cpu")
    request = TraceRequest("pretrained", TEXT, model_id=BUNDLED_DECODER_ID)
    trace = build_trace(request, device="cpu")
    flow = trace_flow(trace, loaded.model, loaded.family)
    mids = {}
    hooks = [block.post_attention_layernorm.register_forward_hook(
        lambda m, args, out, i=i: mids.__setitem__(i, args[0][0].detach().clone()))
        for i, block in enumerate(loaded.model.model.layers)]
    try:
        with torch.no_grad():
            loaded.model(torch.as_tensor(trace.token_ids)[None])
    finally:
        for h in hooks:
            h.remove()
    for layer in (0, trace.n_layers - 1):
        got = flow.layer(layer)
        np.testing.assert_allclose(got.attention_heads.sum((1, 2)) + got.attention_residual, 1.0, atol=1e-5)
        pos = np.arange(trace.n_tokens)
        join, _ = flow.joins(layer, pos)
        np.testing.assert_allclose(join.whole.numpy(), mids[layer].numpy(), rtol=1e-4, atol=1e-4)
    full = build_graph(flow, -1, 0.04)
    compact = build_graph(compact_flow(build_compact(request, device="cpu", predictions=False), loaded.model,
                                       loaded.family), -1, 0.04)
    assert full.n_edges > 0 and list(full.kind) == list(compact.kind)
    np.testing.assert_allclose(full.weight, compact.weight, atol=1e-4)
