"""The notebook's ``patch``: arrays and Plotly figures from one call, on a tiny GPT-2."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from tiny_models import build_tiny_decoder


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
    assert p.to_json()["heads"] == p.heads.tolist()
