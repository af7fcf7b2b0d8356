"""Activation patching from end to end, for the command line and the notebook: resolve the model, check the inputs,
run both prompts, attribution patching, exact patching, and the table of attention beside effect.

The app runs the same steps one by one (``ui.patching``), caching each and showing exact patching's progress.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.effects.patching import (
    ExactPatching,
    PatchRuns,
    Progress,
    Stop,
    exact_patching,
)
from model_core.effects.patching_attribution import (
    AttributionPatching,
    rank_correlation,
    runs_and_attribution,
)
from model_core.effects.patching_inputs import prepare_inputs, require_decoder
from model_core.effects.patching_table import (
    AttentionBesideEffect,
    attention_beside_effect,
)
from model_core.trace.trace import AttentionTrace


@dataclass(frozen=True, eq=False)
class PatchingResult:
    """Everything one patching run computed.

    Attributes:
        runs: the two prompts' metrics and activations (``runs.inputs``: tokens, answer, foil, differing positions).
        exact: exact patching's grids (``exact.partial`` when stopped).
        attribution: attribution patching's grids.
        table: attention beside effect, or None when not asked for.
    """

    runs: PatchRuns
    exact: ExactPatching
    attribution: AttributionPatching
    table: AttentionBesideEffect | None = None

    @property
    def rank_correlation(self) -> dict[str, float]:
        """Spearman's rank correlation of attribution patching with exact patching, per grid."""
        return {"heads": rank_correlation(self.attribution.heads, self.exact.heads),
                "residual": rank_correlation(self.attribution.residual, self.exact.residual)}

    def to_json(self) -> dict[str, Any]:
        """The command line's JSON: metrics, the L × H grids, the residual grids, correlations (NaN as null)."""
        inputs = self.runs.inputs
        out: dict[str, Any] = {
            "clean": self.runs.clean, "corrupt": self.runs.corrupt,
            "heads": _listed(self.exact.heads), "attribution": _listed(self.attribution.heads),
            "residual": _listed(self.exact.residual), "attribution_residual": _listed(self.attribution.residual),
            "rank_correlation": _listed(self.rank_correlation), "partial": self.exact.partial,
            "clean_tokens": list(inputs.clean_tokens), "corrupt_tokens": list(inputs.corrupt_tokens),
            "differing": inputs.differing.tolist(), "answer": inputs.answer, "foil": inputs.foil,
            "answer_id": inputs.answer_id, "foil_id": inputs.foil_id,
        }
        if self.table is not None:
            out["table"] = _listed(self.table.to_rows())
            out["table_correlation"] = _listed(self.table.correlations())
        return out


def _listed(value: Any) -> Any:
    """Arrays as nested lists and NaN as None (JSON has no NaN)."""
    if isinstance(value, np.ndarray):
        return _listed(value.tolist())
    if isinstance(value, dict):
        return {k: _listed(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_listed(v) for v in value]
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def head_dla(trace: AttentionTrace, model: Any, family: Any, answer_id: int, foil_id: int) -> np.ndarray | None:
    """Each head's direct logit attribution to logit(answer) − logit(foil) at the clean prompt's last token
    (``model_core.effects.attribution``), or None where it cannot be computed (the module or the model's norms).

    Shape: -> (layer, head).
    """
    try:
        from model_core.effects.attribution import attribute
    except ImportError:
        return None
    try:
        return np.asarray(attribute(trace, model, family, answer_id, foil_id).heads, dtype=np.float64)
    except (ValueError, RuntimeError) as exc:
        warnings.warn(f"No direct logit attribution for the table: {exc}", stacklevel=2)
        return None


def text_roles(trace: AttentionTrace) -> dict[str, np.ndarray]:
    """The role scores that mean something on any text (previous-token, duplicate-token, sink), on ``trace``."""
    from model_core.roles.scores import TEXT_ROLES, role_scores

    return role_scores(trace, TEXT_ROLES)


def table_for(trace: AttentionTrace, model: Any, family: Any, runs: PatchRuns, exact: ExactPatching,
              attribution: AttributionPatching) -> AttentionBesideEffect:
    """Attention beside effect from the clean prompt's trace, with its DLA and text role scores.

    Raises:
        ValueError: ``trace`` is not the clean prompt's.
    """
    if tuple(int(i) for i in trace.token_ids) != tuple(int(i) for i in runs.inputs.clean_ids):
        raise ValueError("The trace is not the clean prompt's: trace the clean prompt with the same model.")
    inputs = runs.inputs
    return attention_beside_effect(trace, inputs.differing, exact.heads, attribution.heads,
                                   dla=head_dla(trace, model, family, inputs.answer_id, inputs.foil_id),
                                   roles=text_roles(trace))


def patch_prompts(clean: str, corrupt: str, answer: str, foil: str, *, model_id: str | None = None,
                  device: str | torch.device | None = None, settings: Any = None, models: Any = None,
                  table: bool = True, residual: bool = True, progress: Progress | None = None,
                  stop: Stop | None = None) -> PatchingResult:
    """Activation patching of a pretrained decoder on two prompts, from scratch.

    Args:
        clean, corrupt: two prompts of the same number of tokens.
        answer, foil: one token each, as written (" Paris").
        model_id: a hub id, folder or bundled id (None: the deployment's default model).
        table: also trace the clean prompt for attention beside effect.
        residual: also patch the residual stream per (layer, position).
        progress, stop: exact patching's (``exact_patching``).

    Raises:
        PatchingError: the inputs cannot be patched (an encoder, different lengths, not one token, equal metrics).
        InputError, ModelLoadError: a prompt or the model cannot be used.
    """
    from model_core.trace.request import TraceRequest, build_trace
    from model_core.trace.resolve import resolve

    request = TraceRequest("pretrained", clean, "", model_id=model_id)
    resolved = resolve(request, device=device, settings=settings, models=models)
    require_decoder(resolved.family)
    inputs = prepare_inputs(resolved, clean, corrupt, answer, foil)
    trace = None
    if table:  # the clean prompt's trace: the table reads it, and the clean run is read from it (no second pass)
        trace = build_trace(request, device=resolved.device, settings=resolved.settings, models=resolved.models)
    runs, attribution = runs_and_attribution(resolved.family, resolved.model, inputs, clean_trace=trace)
    exact = exact_patching(resolved.family, resolved.model, runs, residual=residual, progress=progress, stop=stop)
    rows = None if trace is None else table_for(trace, resolved.model, resolved.family, runs, exact, attribution)
    return PatchingResult(runs, exact, attribution, rows)
