"""Byte budgets of what the heatmaps page sends, at bert-base shape (deterministic sizes, no timings).

Timings live in bench/bench_app.py; these guard the sizes that make them possible: the browser's
budget for the whole heatmaps page is 5 MB at 128 tokens and 20 MB at 512.
"""

from __future__ import annotations

import json

import numpy as np
import plotly.io as pio
import pytest

from synthetic import synthetic_trace
from model_core.analysis import head_stats
from attention_explorer.figures import HeadGrid, attention_heatmap, layer_head_grids, overview_mosaic

MB = 1_000_000


def _bert_base(n_tokens: int):
    return synthetic_trace(n_tokens, 12, 12, d_head=64, seed=0)


def _page_specs(trace) -> dict[str, str]:
    """The JSON Streamlit sends for each figure of the heatmaps page (plotly.io.to_json, as st.plotly_chart)."""
    s = head_stats(trace)
    figures = {
        "overview": overview_mosaic(trace.weights),
        "focus": attention_heatmap(trace.weights[0, 0], trace.tokens, sentence_b_start=trace.sentence_b_start),
        "summary": layer_head_grids([HeadGrid(getattr(s, name), name) for name in ("entropy", "max_weight", "to_cls",
                                                                                    "to_sep")]),
    }
    return {name: pio.to_json(fig, validate=False) for name, fig in figures.items()}


@pytest.mark.parametrize("n_tokens, budget", [(128, 5 * MB), (512, 20 * MB)])
def test_heatmaps_page_figures_fit_the_byte_budget(n_tokens, budget):
    sizes = {name: len(spec.encode()) for name, spec in _page_specs(_bert_base(n_tokens)).items()}
    # Half the budget: the rest is Streamlit's own messages and the margin for other views.
    assert sum(sizes.values()) <= budget / 2, sizes


def test_focused_head_at_512_tokens_is_a_typed_array_without_customdata():
    trace = _bert_base(512)
    spec = json.loads(_page_specs(trace)["focus"])
    heatmap = spec["data"][0]
    assert "customdata" not in heatmap  # (512, 512, 2) strings were 9 MB of JSON
    assert heatmap["z"]["dtype"] == "f4" and "bdata" in heatmap["z"]
    assert len(pio.to_json(attention_heatmap(trace.weights[0, 0], trace.tokens), validate=False)) < 2 * MB


def test_focused_head_hover_stays_exact():
    """The hover reads 'i: token' from the category axes and the weight to 4 decimals from z."""
    trace = _bert_base(128)
    fig = attention_heatmap(trace.weights[3, 5], trace.tokens)
    heatmap = fig.data[0]
    labels = [f"{i}: {t}" for i, t in enumerate(trace.tokens)]
    assert list(heatmap.x) == labels and list(heatmap.y) == labels
    assert "%{y}" in heatmap.hovertemplate and "%{x}" in heatmap.hovertemplate
    np.testing.assert_allclose(np.asarray(heatmap.z, dtype=np.float64), trace.weights[3, 5], atol=1e-5)


def test_overview_hover_reads_layer_and_head_from_the_coordinates():
    """Each head's cells lie within ±0.5 of its index, so %{x:.0f} and %{y:.0f} name the head exactly."""
    trace = _bert_base(512)
    fig = overview_mosaic(trace.weights)
    heatmap = fig.data[0]
    z = np.asarray(heatmap.z, dtype=np.float64)
    xs, ys = np.asarray(heatmap.x), np.asarray(heatmap.y)
    assert heatmap.customdata is None
    cols = ~np.isnan(z).all(axis=0)
    rows = ~np.isnan(z).all(axis=1)
    m = 32
    assert np.array_equal(np.rint(xs[cols]).astype(int), np.repeat(np.arange(12), m))
    assert np.array_equal(np.rint(ys[rows]).astype(int), np.repeat(np.arange(12), m))
    assert np.abs(xs[cols] - np.rint(xs[cols])).max() < 0.5


def test_trace_at_512_tokens_keeps_no_scores():
    """A 512-token bert-base trace: weights, q/k/v, value norms and hidden states, not the scores (~229 MB)."""
    n, layers, heads, d_head = 512, 12, 12, 64
    trace = synthetic_trace(n, layers, heads, d_head=d_head, seed=0)
    per_head = layers * heads * 4
    expected = (per_head * n * n  # attentions
                + 3 * per_head * n * d_head  # queries, keys, values
                + per_head * n  # value norms
                + trace.hidden_states.nbytes + n * n + 2 * n * 8 + trace.head_mask.nbytes + trace.kv_heads.nbytes)
    assert trace.nbytes <= expected + (trace.logits.nbytes if trace.logits is not None else 0)
    assert trace.nbytes < 240 * MB


def test_long_focused_head_is_laid_out_once_with_room_for_its_labels():
    """Past FIXED_MARGIN_TOKENS the figure carries its colour range and fixed margins, so Plotly neither
    scans 262k values nor measures the labels and lays out again; the margins fit the longest shown label."""
    from attention_explorer.figures import FIXED_MARGIN_TOKENS, TICK_CHAR_PX

    trace = _bert_base(512)
    tokens = list(trace.tokens)
    tokens[0] = "internationalisation"  # a long label on a shown tick (the first is always shown)
    fig = attention_heatmap(trace.weights[1, 2], tuple(tokens))
    heatmap, layout = fig.data[0], fig.layout
    assert heatmap.zmin == 0 and heatmap.zmax == pytest.approx(float(trace.weights[1, 2].max()), abs=1e-5)
    assert layout.margin.autoexpand is False
    assert layout.xaxis.automargin is False and layout.yaxis.automargin is False
    assert layout.xaxis.tickangle == -90
    assert "internationalisation" in layout.xaxis.ticktext
    assert layout.margin.l >= TICK_CHAR_PX * len("internationalisation")
    assert layout.margin.t >= TICK_CHAR_PX * len("internationalisation")
    # Short inputs keep Plotly's own measured margins.
    short = attention_heatmap(trace.weights[1, 2, :FIXED_MARGIN_TOKENS, :FIXED_MARGIN_TOKENS],
                              tuple(tokens[:FIXED_MARGIN_TOKENS]))
    assert short.layout.margin.autoexpand is None and short.layout.xaxis.automargin is None


def test_pooling_averages_queries_and_sums_keys_so_rows_still_sum_to_one():
    from model_core.analysis.aggregate import pool_matrix

    rng = np.random.default_rng(3)
    a = rng.random((2, 3, 70, 70))
    a /= a.sum(-1, keepdims=True)
    pooled = pool_matrix(a, 32, sum_keys=True)
    assert pooled.shape == (2, 3, 32, 32)
    np.testing.assert_allclose(pooled.sum(-1), 1.0, atol=1e-12)
    # By hand: blocks from the same edges as np.linspace(0, 70, 33).round().
    edges = np.append(np.linspace(0, 70, 33).round().astype(int)[:-1], 70)
    for i, j in [(0, 0), (5, 17), (31, 31)]:
        block = a[1, 2, edges[i]:edges[i + 1], edges[j]:edges[j + 1]]
        assert pooled[1, 2, i, j] == pytest.approx(block.sum(-1).mean())
        assert pool_matrix(a, 32)[1, 2, i, j] == pytest.approx(block.mean())
    assert pool_matrix(a, 80, sum_keys=True) is a  # nothing to pool


def test_overview_of_a_long_input_is_not_washed_out():
    """A head that attends to its own position is a dark diagonal in the pooled thumbnail (share ~1),
    not the 1/16 a block average would leave of it at 512 tokens."""
    n = 512
    eye = np.broadcast_to(np.eye(n, dtype=np.float32), (2, 2, n, n)).copy()
    z = np.asarray(overview_mosaic(eye).data[0].z, dtype=np.float64)
    head = z[:32, :32]
    np.testing.assert_allclose(np.diag(head), 1.0, atol=1e-3)
    assert np.nansum(head) == pytest.approx(32, abs=0.05)


def test_a_deep_models_overview_has_as_many_cells_as_its_height_shows():
    """30 layers at 512 tokens: 12 x 12 cells a head (at 32 a cell was under a pixel tall), a quarter of the bytes;
    up to 32 tokens every token is its own cell, whatever the depth; a 12-layer model keeps 32 x 32."""
    from attention_explorer.figures import overview_cells

    assert overview_cells(30, 20) == 20 and overview_cells(30, 512) == 12 and overview_cells(12, 512) == 32
    sink = np.zeros((30, 9, 512, 512), dtype=np.float32)
    sink[..., 0] = 1.0  # every head puts all its weight on the first token
    fig = overview_mosaic(sink)
    z = np.asarray(fig.data[0].z, dtype=np.float64)
    assert z.shape == (30 * 13 - 1, 9 * 13 - 1)
    np.testing.assert_allclose(z[:12, 0], 1.0)  # the sink column survives the pooling
    assert len(pio.to_json(fig, validate=False)) < 0.6 * MB
