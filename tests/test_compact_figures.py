"""The compact form's token x token figures are the one builder's (attention_explorer.figures.attention_heatmap):
a window labelled with its own positions, a pooled head on position axes, groups by their text."""

from __future__ import annotations

import numpy as np

from ui.compact_figures import grouped_head_figure, pooled_head_figure, window_figure

TOKENS = tuple(f"t{i}" for i in range(10))


def test_a_window_is_labelled_with_its_positions_and_its_masked_cells_are_gaps():
    weights = np.full((3, 4), 0.25)
    masked = np.zeros((3, 4), dtype=bool)
    masked[0, 3] = True
    fig = window_figure(weights, TOKENS, (5, 8), (2, 6), masked, "w")
    heat = fig.data[0]
    assert list(heat.y) == ["5: t5", "6: t6", "7: t7"] and list(heat.x) == ["2: t2", "3: t3", "4: t4", "5: t5"]
    assert np.isnan(heat.z[0][3]) and heat.z[1][3] == np.float32(0.25)
    assert fig.layout.plot_bgcolor != "white"  # the gaps show the masked colour


def test_a_pooled_head_has_position_axes_centred_on_its_blocks_and_a_box_selection():
    cells = np.array([[1.0, 0.0], [0.5, 0.5]])
    fig = pooled_head_figure(cells, 6, TOKENS, "pooled")
    heat = fig.data[0]
    np.testing.assert_array_equal(heat.x, [2.5, 7.5])  # blocks 0-5 and 6-9 (the last is shorter)
    assert fig.layout.dragmode == "select" and fig.layout.xaxis.range == (-0.5, 9.5)
    assert "queries around" in heat.hovertemplate


def test_groups_are_numbered_once_and_their_text_escaped():
    fig = grouped_head_figure(np.eye(2), ["0: [0–3] <b>bold</b>", "1: [4–9] rest"], "groups")
    assert list(fig.data[0].x) == ["0: [0–3] &lt;b&gt;bold&lt;/b&gt;", "1: [4–9] rest"]
