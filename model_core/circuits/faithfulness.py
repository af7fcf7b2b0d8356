"""A circuit's faithfulness at growing edge budgets, and the areas MIB reports (Mueller et al., 2025).

faithfulness(C) = (m(C) − m(∅)) / (m(N) − m(∅)): m(C) the mean metric with only the circuit's edges carrying the
clean run, m(N) the clean mean (every edge), m(∅) the corrupted mean (no edge). The curve is taken at ``FRACTIONS``
of the edges.

CPR (higher is better) is the trapezoid area under F over the fractions on a *linear* axis from 0.001 to 1: no point
at 0, no log axis, no pruning. CMD (lower is better) is the same area under |1 − F|. MIB's own code can integrate
over the log of the edge count instead; ``cpr_log`` and ``cmd_log`` give that variant, named apart so the page can
show it beside the linear one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

FRACTIONS: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
"""The edge fractions of the curve, exactly MIB's."""


def faithfulness(m_circuit: float | np.ndarray, m_clean: float, m_corrupt: float) -> float | np.ndarray:
    """(m(C) − m(∅)) / (m(N) − m(∅)): 1 when the circuit restores the clean metric, 0 when it does nothing.

    Raises:
        ValueError: m(N) equals m(∅), so nothing can be normalised.
    """
    denominator = float(m_clean) - float(m_corrupt)
    if denominator == 0.0 or not math.isfinite(denominator):
        raise ValueError(f"The clean and corrupted means are equal ({m_clean!r}), so faithfulness cannot be "
                         "normalised: choose pairs whose corruption changes the answer.")
    result = (np.asarray(m_circuit, dtype=np.float64) - float(m_corrupt)) / denominator
    return float(result) if result.ndim == 0 else result


def _checked(values: Sequence[float], fractions: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    f = np.asarray(fractions, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    if f.ndim != 1 or y.shape != f.shape or len(f) < 2:
        raise ValueError(f"A curve needs one faithfulness a fraction ({len(y)} values for {len(f)} fractions), "
                         "at least two.")
    if np.any(np.diff(f) <= 0) or f[0] <= 0:
        raise ValueError("The fractions must be positive and increasing.")
    return f, y


def _trapezoid(x: np.ndarray, y: np.ndarray) -> float:
    """Σᵢ (xᵢ₊₁ − xᵢ)(yᵢ + yᵢ₊₁)/2, summed in order."""
    return float(sum((x[i + 1] - x[i]) * (y[i] + y[i + 1]) / 2 for i in range(len(x) - 1)))


def cpr(values: Sequence[float], fractions: Sequence[float] = FRACTIONS) -> float:
    """CPR: Σᵢ (fᵢ₊₁ − fᵢ)(Fᵢ + Fᵢ₊₁)/2 over the fractions, on a linear axis (higher is better)."""
    f, y = _checked(values, fractions)
    return _trapezoid(f, y)


def cmd(values: Sequence[float], fractions: Sequence[float] = FRACTIONS) -> float:
    """CMD: the same area under |1 − F| (lower is better)."""
    f, y = _checked(values, fractions)
    return _trapezoid(f, np.abs(1.0 - y))


def cpr_log(values: Sequence[float], fractions: Sequence[float] = FRACTIONS) -> float:
    """The log-axis variant MIB's code can use: the trapezoid area under F over ln(f) (equal to MIB's over the log
    of the edge count when each budget is f·E), not normalised. Not the CPR this project reports."""
    f, y = _checked(values, fractions)
    return _trapezoid(np.log(f), y)


def cmd_log(values: Sequence[float], fractions: Sequence[float] = FRACTIONS) -> float:
    """The log-axis variant of CMD: the area under |1 − F| over ln(f)."""
    f, y = _checked(values, fractions)
    return _trapezoid(np.log(f), np.abs(1.0 - y))
