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
