"""The patching page's correlations come from the core (``estimate_correlation``, ``attention_correlation``): each
against a naive Spearman's ρ (Pearson's r of the ranks, on data without ties)."""

from __future__ import annotations

import numpy as np
import pytest

from model_core.effects.patching import ExactPatching
from model_core.effects.patching_attribution import AttributionPatching
from model_core.effects.patching_run import estimate_correlation
from model_core.effects.patching_table import AttentionBesideEffect


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Naive: no ties, every value finite."""
    rx, ry = (np.argsort(np.argsort(np.ravel(v))) for v in (x, y))
    return float(np.corrcoef(rx, ry)[0, 1])


def test_the_scatters_correlation_is_of_attention_with_the_size_of_the_effect_or_of_the_estimate():
    rng = np.random.default_rng(0)
    attention, effect, estimate = (rng.normal(size=(3, 4)) for _ in range(3))
    table = AttentionBesideEffect(attention, attention, effect, estimate)
    assert table.attention_correlation() == pytest.approx(_spearman(attention, np.abs(effect)))
    assert table.attention_correlation(estimate=True) == pytest.approx(_spearman(attention, np.abs(estimate)))
    assert table.correlations()["attention_vs_abs_effect"] == table.attention_correlation()
    assert table.attention_correlation() != pytest.approx(table.attention_correlation(estimate=True))


def test_estimate_correlation_reads_both_grids_and_leaves_out_cells_a_stopped_run_did_not_reach():
    rng = np.random.default_rng(1)
    heads, resid, est_heads, est_resid = (rng.normal(size=(3, 4)) for _ in range(4))
    stopped = heads.copy()
    stopped[2] = np.nan  # the last layer not patched yet
    rho = estimate_correlation(AttributionPatching(est_heads, est_resid, metric=0.0),
                               ExactPatching(stopped, resid, partial=True))
    assert rho["heads"] == pytest.approx(_spearman(est_heads[:2], heads[:2]))
    assert rho["residual"] == pytest.approx(_spearman(est_resid, resid))
