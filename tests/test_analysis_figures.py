"""The analysis figures carry the numbers they are given, and download as PNG or SVG."""

import numpy as np
import pytest

from model_core.analysis import compare_masking, compare_word, special_token_mass
from synthetic import synthetic_trace
from attention_explorer.analysis_figures import (
    context_bins_figure,
    logits_figure,
    special_mass_figure,
)
from attention_explorer.figures import attention_heatmap, layer_head_figure, plotly_config


def test_plotly_config_sets_the_download_format_and_name():
    config = plotly_config("rollout", "svg")
    assert config["toImageButtonOptions"]["format"] == "svg"
    assert config["toImageButtonOptions"]["filename"] == "rollout"
    with pytest.raises(ValueError, match="png"):
        plotly_config("x", "jpeg")


def test_token_matrix_keeps_repeated_tokens_apart():
    trace = synthetic_trace(13, 1, 1)
    fig = attention_heatmap(trace.weights[0, 0], trace.tokens, title="t")
    assert list(fig.layout.xaxis.ticktext).count("flies") == 2
    assert len(set(fig.data[0].x)) == 13  # "2: flies" and "8: flies" are two columns
    np.testing.assert_allclose(np.asarray(fig.data[0].z), trace.weights[0, 0], atol=1e-5)


def test_clickable_grid_has_one_point_per_defined_head():
    grid = np.arange(6.0).reshape(2, 3)
    grid[1, 2] = np.nan
    fig = layer_head_figure(grid, "g", clickable=True)
    points = list(zip(fig.data[1].y, fig.data[1].x, strict=True))
    assert points == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    np.testing.assert_allclose(fig.data[1].customdata, [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(np.asarray(fig.data[0].z), grid)


def test_context_and_mass_figures_plot_the_analysis_numbers():
    trace = synthetic_trace(13, 2, 2)
    comparison = compare_word(trace, "flies")
    bars = context_bins_figure(comparison, 1, 0)
    np.testing.assert_allclose(bars.data[1].y, comparison.dist_second[1, 0])
    mass = special_token_mass(trace)
    lines = special_mass_figure(mass)
    assert [t.name for t in lines.data] == list(mass.per_layer())


def test_logits_figure_needs_logits():
    trace = synthetic_trace(13, 1, 1, logits=False)
    with pytest.raises(ValueError, match="custom encoder"):
        logits_figure(compare_masking(trace, trace))


def _grids(n_layers: int, n_heads: int) -> list:
    from attention_explorer.figures import HeadGrid

    rng = np.random.default_rng(0)
    values = [rng.random((n_layers, n_heads)) for _ in range(4)]
    values[0][1, 2] = np.nan  # a head without a value stays blank
    return [HeadGrid(values[0] * 5, "Entropy (bits)"), HeadGrid(values[1], "Largest weight", 0.0, 1.0),
            HeadGrid(values[2], "Share to the first token", 0.0, 1.0), HeadGrid(values[3], "Share to [SEP]", 0.0, 1.0)]


def test_several_grids_are_one_figure_with_their_own_values_titles_and_shared_colour_bars():
    from attention_explorer.figures import layer_head_grids

    grids = _grids(30, 9)
    fig = layer_head_grids(grids)
    assert len(fig.data) == 4
    for trace, grid in zip(fig.data, grids, strict=True):
        np.testing.assert_array_equal(np.asarray(trace.z), grid.values)
        assert grid.title in trace.hovertemplate
    # The three shares run 0..1 and share one colour bar; the entropy has its own range and bar.
    assert [t.coloraxis for t in fig.data] == ["coloraxis", "coloraxis2", "coloraxis2", "coloraxis2"]
    assert (fig.layout.coloraxis.cmin, fig.layout.coloraxis2.cmin, fig.layout.coloraxis2.cmax) == (None, 0.0, 1.0)
    assert [a.text for a in fig.layout.annotations] == ["Entropy (bits)", "Largest weight", "Share to the first<br>token",
                                                        "Share to [SEP]"]
    # One row of four: side by side, in order, none overlapping, the first one's bar in the gap after it.
    domains = [fig.layout[f"xaxis{n}"].domain for n in ("", "2", "3", "4")]
    assert all(a[1] < b[0] for a, b in zip(domains, domains[1:]))
    assert domains[0][0] == 0.0 and domains[-1][1] == pytest.approx(1.0)
    assert domains[0][1] < fig.layout.coloraxis.colorbar.x < domains[1][0]
    assert len({tuple(fig.layout[f"yaxis{n}"].domain) for n in ("", "2", "3", "4")}) == 1
    assert [fig.layout[f"yaxis{n}"].showticklabels for n in ("", "2", "3", "4")] == [True, False, False, False]


def test_grids_of_a_wide_model_take_two_rows_and_mismatched_grids_are_refused():
    from attention_explorer.figures import HeadGrid, layer_head_grids

    fig = layer_head_grids(_grids(4, 32))
    tops = [fig.layout[f"yaxis{n}"].domain[1] for n in ("", "2", "3", "4")]
    assert tops[0] == tops[1] > tops[2] == tops[3]  # two a row past 16 heads
    assert fig.layout.yaxis3.domain[1] < fig.layout.yaxis.domain[0]
    # The shares' one bar stands beside the first row that shows a share, and the rows' grids line up.
    assert fig.layout.yaxis.domain[0] < fig.layout.coloraxis2.colorbar.y < fig.layout.yaxis.domain[1]
    assert fig.layout.xaxis3.domain == fig.layout.xaxis.domain and fig.layout.xaxis4.domain == fig.layout.xaxis2.domain
    with pytest.raises(ValueError, match="same"):
        layer_head_grids([HeadGrid(np.zeros((2, 3)), "a"), HeadGrid(np.zeros((3, 3)), "b")])
    with pytest.raises(ValueError, match="at least one"):
        layer_head_grids([])
