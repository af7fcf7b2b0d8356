"""The "Why this key" page's data and figures: the QK split of a focused head, computed once per (trace, head, query,
key, versus) for every session (``cached_qk``), and the figures that draw it."""

from __future__ import annotations

from typing import Any

import numpy as np

from attention_explorer.qk import (  # noqa: F401 (the page's)
    bars_figure,
    row_csv,
    row_figure,
    terms_csv,
    terms_figure,
)
from model_core import TraceRequest
from model_core.qk.gather import PartsPass
from model_core.qk.terms import QKTerms, qk_pass_for_trace, split_at
from model_core.trace.resolve import resolve
from ui.trace_cache import per_trace

INDUCTION_TEXT = ("The lighthouse keeper counted seven blue herons before the storm reached the harbour. "
                  "The lighthouse keeper counted seven blue herons before the storm reached the harbour.")
"""The team's ready example: a sentence said twice. In the repeat, an induction head attends from each token to the
token after its first occurrence; its score there follows a previous-token head's writes (K-composition)."""

@per_trace(spinner="Splitting this head's queries and keys into the parts of the residual stream…")
def cached_qk_pass(trace: Any, request: TraceRequest, layer: int, head: int) -> PartsPass:
    """The parts behind every split of one head on the trace's tokens (the positions the heatmaps show), once per
    (trace, head), from the full trace where there is one, else by the head's hooked pass: a change of query or key
    then costs no model run."""
    from ui.loaders import (  # ui.loaders imports the pages' caches; only needed on a miss
        CACHED_MODELS,
        device,
    )

    resolved = resolve(request, device=device(), models=CACHED_MODELS)
    return qk_pass_for_trace(resolved.model, trace, layer, head)


def cached_qk(trace: Any, request: TraceRequest, layer: int, head: int, query: int, key: int | None,
              versus: int | None, row: bool) -> QKTerms:
    """``model_core.qk.terms.split_at`` on the head's cached pass."""
    pass_ = cached_qk_pass(trace, request, layer, head)
    return split_at(pass_, [str(t) for t in trace.tokens], query, key, versus, row=row)


def induction_scores(weights: np.ndarray, period: int) -> np.ndarray:
    """Each head's induction score on a sequence repeated with ``period``: the mean attention from each token of the
    repeat to the token after its earlier occurrence. Shape: weights (layer, head, q, k) -> (layer, head)."""
    n = weights.shape[-1]
    rows = np.arange(period, n)
    if len(rows) == 0:
        return np.zeros(weights.shape[:2])
    return weights[:, :, rows, rows - period + 1].mean(axis=-1)
