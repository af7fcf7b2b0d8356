"""Activation patching from end to end: resolve the model, check the inputs, run both prompts, attribution patching,
exact patching, and the table of attention beside effect.

``PatchingPipeline`` holds each step once. ``patch_prompts`` (the command line, the notebook) runs them all; the app
(``ui.patching``) runs the same steps one by one, caching each and showing exact patching's progress.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.effects.attribution import attribute
from model_core.effects.patching import (
    ExactPatching,
    PatchRuns,
    Progress,
    Stop,
    batch_size,
    exact_patching,
)
from model_core.effects.patching_attribution import (
    AttributionPatching,
    rank_correlation,
    runs_and_attribution,
)
from model_core.effects.patching_inputs import PatchInputs, prepare_inputs
from model_core.effects.patching_table import (
    AttentionBesideEffect,
    attention_beside_effect,
)
from model_core.models.run_memory import (
    check_run_memory,
    device_of,
    longest_fitting,
    model_shape,
    patching_bytes,
    run_memory_limit_mb,
)
from model_core.roles.scores import TEXT_ROLES, role_scores
from model_core.trace.request import TraceRequest, build_trace
from model_core.trace.resolve import resolve
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
        return estimate_correlation(self.attribution, self.exact)

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


def estimate_correlation(attribution: AttributionPatching, exact: ExactPatching) -> dict[str, float]:
    """Spearman's rank correlation of attribution patching's estimate with exact patching: {"heads", "residual"}
    (cells a stopped run did not reach are left out)."""
    return {"heads": rank_correlation(attribution.heads, exact.heads),
            "residual": rank_correlation(attribution.residual, exact.residual)}


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
    (``model_core.effects.attribution``), or None where it cannot be computed (the model's norms).

    Shape: -> (layer, head).
    """
    try:
        return np.asarray(attribute(trace, model, family, answer_id, foil_id).heads, dtype=np.float64)
    except (ValueError, RuntimeError) as exc:
        warnings.warn(f"No direct logit attribution for the table: {exc}", stacklevel=2)
        return None


def text_roles(trace: AttentionTrace) -> dict[str, np.ndarray]:
    """The role scores that mean something on any text (previous-token, duplicate-token, sink), on ``trace``."""
    return role_scores(trace, TEXT_ROLES)


TableParts = tuple[np.ndarray | None, dict[str, np.ndarray]]
"""The table's columns that read only the clean prompt's trace and the model: each head's DLA (or None) and its text
role scores."""


def table_parts(trace: AttentionTrace, model: Any, family: Any, answer_id: int, foil_id: int) -> TableParts:
    """``head_dla`` and ``text_roles`` of the clean prompt's trace: what the table reads besides the patching grids."""
    return head_dla(trace, model, family, answer_id, foil_id), text_roles(trace)


def table_for(trace: AttentionTrace, inputs: PatchInputs, heads: np.ndarray, attribution: np.ndarray,
              parts: TableParts) -> AttentionBesideEffect:
    """Attention beside effect from the clean prompt's trace, its ``table_parts`` and the patching grids.

    Args:
        heads: exact patching's effects (NaN where not patched yet). Shape: (layer, head).
        attribution: attribution patching's estimate. Shape: (layer, head).

    Raises:
        ValueError: ``trace`` is not the clean prompt's.
    """
    if tuple(int(i) for i in trace.token_ids) != tuple(int(i) for i in inputs.clean_ids):
        raise ValueError("The trace is not the clean prompt's: trace the clean prompt with the same model.")
    dla, roles = parts
    return attention_beside_effect(trace, inputs.differing, heads, attribution, dla=dla, roles=roles)


def check_patching_memory(resolved: Any, n_tokens: int, *, attribution: bool = True) -> None:
    """Refuse patching two prompts of ``n_tokens`` tokens whose estimated memory (``run_memory.patching_bytes``:
    both runs' activations, the batched patched passes and, with ``attribution``, the gradient pass) is over
    ``AE_RUN_MEMORY_MB`` of ``resolved``'s settings.

    Raises:
        RunMemoryError: the estimate, the limit and the longest prompts that fit.
    """
    shape = model_shape(resolved.model)
    limit = run_memory_limit_mb(getattr(resolved, "settings", None), device=device_of(resolved.model))

    def estimate(t: int) -> float:
        return patching_bytes(shape, max(t, 1), attribution=attribution, copies=batch_size(max(t, 1)))
    if estimate(n_tokens) <= limit * 1e6:
        return
    longest = longest_fitting(estimate, limit, hi=1 << 15)
    check_run_memory(f"Activation patching of two prompts of {n_tokens:,} tokens"
                     + (" (with attribution patching's gradient pass)" if attribution else ""),
                     estimate(n_tokens), limit, f"Prompts of up to about {longest:,} tokens fit on this model.")


@dataclass(frozen=True, eq=False)
class PatchingPipeline:
    """Activation patching of one checked prompt pair on one model, step by step; each step is written only here.

    ``patch_prompts`` runs every step at once; the app runs them one at a time (the passes in the gate's turn, exact
    patching when asked, with progress, a Stop and a resume; the table's parts in a thread of their own).

    Attributes:
        resolved: the model (``model_core.trace.resolve.Resolved``, a decoder).
        inputs: the prompts as the model reads them, and the answer and foil (``prepare_inputs``).
    """

    resolved: Any
    inputs: PatchInputs

    @classmethod
    def prepare(cls, resolved: Any, clean: str, corrupt: str, answer: str, foil: str) -> PatchingPipeline:
        """Check the prompts, the answer and the foil on ``resolved``'s model (``prepare_inputs``).

        Raises:
            PatchingError, NotADecoder, NotOneToken, InputError: the message says what to change.
        """
        return cls(resolved, prepare_inputs(resolved, clean, corrupt, answer, foil))

    def runs(self, clean_trace: AttentionTrace | None = None) -> tuple[PatchRuns, AttributionPatching]:
        """Both prompts' runs and attribution patching (``runs_and_attribution``; the clean run read from the clean
        prompt's trace when given).

        Raises:
            RunMemoryError: the passes would not fit ``AE_RUN_MEMORY_MB`` (``check_patching_memory``).
        """
        check_patching_memory(self.resolved, self.inputs.n_tokens, attribution=True)
        return runs_and_attribution(self.resolved.family, self.resolved.model, self.inputs, clean_trace=clean_trace)

    def exact(self, runs: PatchRuns, **options: Any) -> ExactPatching:
        """Exact patching of ``runs`` (``exact_patching``'s options: residual, progress, stop, keep, resume)."""
        return exact_patching(self.resolved.family, self.resolved.model, runs, **options)

    def table_parts(self, trace: AttentionTrace) -> TableParts:
        """The table's DLA and role scores on the clean prompt's ``trace`` (``table_parts``)."""
        return table_parts(trace, self.resolved.model, self.resolved.family, self.inputs.answer_id,
                           self.inputs.foil_id)

    def table(self, trace: AttentionTrace, heads: np.ndarray, attribution: np.ndarray,
              parts: TableParts | None = None) -> AttentionBesideEffect:
        """Attention beside effect (``table_for``); ``parts`` when already computed, else computed here."""
        return table_for(trace, self.inputs, heads, attribution,
                         self.table_parts(trace) if parts is None else parts)


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
        PatchingError, NotADecoder, NotOneToken: the inputs cannot be patched (different lengths, equal metrics; an
            encoder; an answer or foil that is not one token).
        InputError, ModelLoadError: a prompt or the model cannot be used.
    """
    request = TraceRequest("pretrained", clean, "", model_id=model_id)
    resolved = resolve(request, device=device, settings=settings, models=models)
    pipeline = PatchingPipeline.prepare(resolved, clean, corrupt, answer, foil)
    trace = None
    if table:  # the clean prompt's trace: the table reads it, and the clean run is read from it (no second pass)
        trace = build_trace(request, device=resolved.device, settings=resolved.settings, models=resolved.models)
    runs, attribution = pipeline.runs(trace)
    exact = pipeline.exact(runs, residual=residual, progress=progress, stop=stop)
    rows = None if trace is None else pipeline.table(trace, exact.heads, attribution.heads)
    return PatchingResult(runs, exact, attribution, rows)
