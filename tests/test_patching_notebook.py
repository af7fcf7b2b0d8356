"""The notebook's ``patch``: arrays and Plotly figures from one call, on a tiny GPT-2."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import torch
from tiny_models import build_tiny_decoder


def _reference_patching(folder, clean_ids, corrupt_ids, answer_id: int, foil_id: int):
    """A naive reference on plain transformers (eager GPT-2, its own ``c_proj`` pre-hooks): both prompts' metrics and
    each head's exact effect, patched one (layer, head) at a time at every position. Shape: effects (layer, head)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), attn_implementation="eager").eval()
    n_layers, n_heads = model.config.n_layer, model.config.n_head
    d_head = model.config.n_embd // n_heads

    def metric(ids, layer: int = 0, hook=None) -> float:
        handle = None if hook is None else model.transformer.h[layer].attn.c_proj.register_forward_pre_hook(hook)
        try:
            with torch.no_grad():
                logits = model(torch.tensor([list(ids)])).logits[0, -1]
        finally:
            if handle is not None:
                handle.remove()
        return float(logits[answer_id] - logits[foil_id])

    clean_z = {}
    for layer in range(n_layers):
        metric(clean_ids, layer, lambda _m, args, layer=layer: clean_z.__setitem__(layer, args[0].clone()))
    m_clean, m_corrupt = metric(clean_ids), metric(corrupt_ids)
    effects = np.zeros((n_layers, n_heads))
    for layer in range(n_layers):
        for head in range(n_heads):
            cols = slice(head * d_head, (head + 1) * d_head)

            def swap(_m, args, layer=layer, cols=cols):
                z = args[0].clone()
                z[..., cols] = clean_z[layer][..., cols]  # z: (batch, pos, head * d_head), heads side by side
                return (z,)

            effects[layer, head] = (metric(corrupt_ids, layer, swap) - m_corrupt) / (m_clean - m_corrupt)
    return m_clean, m_corrupt, effects


def test_patch_returns_arrays_and_figures(tmp_path):
    from attention_explorer.patching import patch

    folder = build_tiny_decoder("gpt2", tmp_path / "gpt2")
    p = patch("The cat sat on the mat", "The bank sat on the mat", " cat", " bank", model=str(folder))
    assert p.heads.shape == p.attribution.shape == (2, 4)
    assert p.residual.shape == p.attribution_residual.shape == (2, len(p.tokens))
    assert p.clean != p.corrupt and np.isfinite(p.heads).all()
    np.testing.assert_allclose(p.residual[0, 1], 1.0, atol=1e-5)  # the changed embedding restores the clean run
    figures = [p.heads_figure(), p.attribution_figure(), p.residual_figure(), p.residual_figure(attribution=True),
               p.scatter()]
    assert all(isinstance(f, go.Figure) for f in figures)
    # the two head grids share one diverging scale
    assert figures[0].data[0].zmax == figures[1].data[0].zmax == -figures[0].data[0].zmin
    table = p.table()
    assert len(table) == 8 and {"attention", "norm_weighted", "dla", "attribution", "effect"} <= set(table.columns)
    assert set(p.rank_correlation) == {"heads", "residual"}
    # the JSON's numbers against a naive recomputation on plain transformers, not against the result's own arrays
    inputs = p.result.runs.inputs
    m_clean, m_corrupt, effects = _reference_patching(folder, inputs.clean_ids, inputs.corrupt_ids, inputs.answer_id,
                                                      inputs.foil_id)
    body = p.to_json()
    np.testing.assert_allclose([body["clean"], body["corrupt"]], [m_clean, m_corrupt], atol=1e-4)
    np.testing.assert_allclose(np.array(body["heads"], dtype=np.float64), effects, atol=1e-4)
