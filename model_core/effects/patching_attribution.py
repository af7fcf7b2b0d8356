"""Attribution patching (Nanda 2023): exact patching's grids estimated to first order from one forward and one
backward pass of the corrupted prompt.

Patching an activation a from its corrupted value to its clean one changes the metric by about
(a_clean − a_corrupt) · ∂m/∂a, the gradient taken in the corrupted run. For a head, a is its ``z`` at every position
(summed over positions and d_head); for the residual stream, ``resid_pre`` of one layer at one position (summed over
d_model). Both are normalised as exact patching is, by m_clean − m_corrupt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.effects.patching import (
    RESID,
    PatchRuns,
    Run,
    Z,
    layer_hooks,
    make_runs,
    metric_of,
    point_hooks,
    read_run,
)
from model_core.effects.patching_inputs import PatchInputs
from model_core.families import Family
from model_core.gate import GATE
from model_core.trace.trace import AttentionTrace


@dataclass(frozen=True, eq=False)
class AttributionPatching:
    """Attribution patching's estimated effects, normalised like exact patching's.

    Shape: heads (layer, head); residual (layer, pos).
    """

    heads: np.ndarray
    residual: np.ndarray
    metric: float
    """The corrupted run's metric in the gradient pass (equals ``PatchRuns.corrupt``)."""


@dataclass(frozen=True, eq=False)
class GradientPass:
    """The corrupted prompt's run with autograd: its metric, z and resid_pre, and the metric's gradient to each.

    Shape: z, dz (layer, pos, head, d_head); resid, dresid (layer, pos, d_model).
    """

    metric: float
    z: torch.Tensor
    resid: torch.Tensor
    dz: torch.Tensor
    dresid: torch.Tensor

    @property
    def run(self) -> Run:
        """The corrupted run as ``make_runs`` takes it."""
        return self.metric, self.z, self.resid


def gradient_pass(family: Family, model: Any, inputs: PatchInputs) -> GradientPass:
    """One forward pass of the corrupted prompt with autograd (``Family.forward(grad=True)``), reading every head's
    ``z`` and every layer's ``resid_pre``, and one backward pass of the metric to them.

    The model's weights stay frozen: the graph starts at the first block's input, made a leaf for this pass, and
    ``torch.autograd.grad`` takes the gradients of these activations alone (nothing is written into the shared
    model's ``.grad``).
    """
    z: dict[int, torch.Tensor] = {}
    resid: dict[int, torch.Tensor] = {}

    def read_z(layer: int, value: torch.Tensor) -> None:
        z[layer] = value  # in the graph: the gradient reaches it through the output projection

    def read_resid(layer: int, value: torch.Tensor) -> torch.Tensor | None:
        if layer == 0:
            value = value.detach().requires_grad_(True)  # the graph's leaf; later layers hang off it
            resid[0] = value
            return value
        resid[layer] = value
        return None

    dev = next(model.parameters()).device
    ids = torch.as_tensor(inputs.corrupt_ids, dtype=torch.long, device=dev)[None]
    every = range(family.n_layers(model.config))
    hooks = layer_hooks(RESID, every, read_resid) + layer_hooks(Z, every, read_z)
    with GATE.turn(), torch.enable_grad(), point_hooks(family, model, hooks):
        out = family.forward(model, ids, torch.zeros_like(ids), None, vectors=False, hidden="last", grad=True)
        metric = metric_of(family, model, out.hidden[-1][:, -1], inputs)[0]
        layers = range(len(z))
        grads = torch.autograd.grad(metric, [z[i] for i in layers] + [resid[i] for i in layers])
    stack = lambda tensors: torch.stack([t[0].detach() for t in tensors])
    return GradientPass(float(metric.detach()), stack([z[i] for i in layers]), stack([resid[i] for i in layers]),
                        stack(grads[:len(z)]), stack(grads[len(z):]))


@torch.no_grad()
def _estimate(runs: PatchRuns, grad: GradientPass) -> AttributionPatching:
    """(a_clean − a_corrupt)·∂m/∂a per head (summed over positions and d_head) and per residual (layer, position),
    normalised by m_clean − m_corrupt."""
    heads = ((runs.z_clean - runs.z_corrupt) * grad.dz.to(runs.z_clean.dtype)).sum(dim=(1, 3))  # (layer, head)
    residual = ((runs.resid_clean - runs.resid_corrupt) * grad.dresid.to(runs.resid_clean.dtype)).sum(dim=-1)
    scale = runs.denominator
    return AttributionPatching(heads.double().cpu().numpy() / scale, residual.double().cpu().numpy() / scale,
                               grad.metric)


def attribution_patching(family: Family, model: Any, runs: PatchRuns) -> AttributionPatching:
    """Attribution patching's estimate of both grids from one forward and one backward pass of the corrupted prompt
    (``gradient_pass``) and the clean run's activations.

    Shape: -> heads (layer, head), residual (layer, pos).
    """
    return _estimate(runs, gradient_pass(family, model, runs.inputs))


def runs_and_attribution(family: Family, model: Any, inputs: PatchInputs, *,
                         clean_trace: AttentionTrace | None = None) -> tuple[PatchRuns, AttributionPatching]:
    """Both runs and attribution patching in as few passes as they need: the clean run (read from ``clean_trace``
    when given, ``clean_from_trace``, else one pass) and the corrupted run with its gradients (one forward and one
    backward pass), which is also the corrupted run exact patching patches into.

    Raises:
        PatchingError: the two metrics are equal.
    """
    with GATE.turn():
        clean = (clean_from_trace(clean_trace, family, model, inputs) if clean_trace is not None
                 else read_run(family, model, inputs.clean_ids, inputs))
        grad = gradient_pass(family, model, inputs)
    runs = make_runs(inputs, clean, grad.run)
    return runs, _estimate(runs, grad)


@torch.no_grad()
def clean_from_trace(trace: AttentionTrace, family: Family, model: Any, inputs: PatchInputs) -> Run:
    """The clean run read from the clean prompt's full trace instead of a pass: z = Σ_k α_qk v_k per head (the
    trace's values are per query head), resid_pre = the trace's residual stream before each layer, and the metric
    from its last layer's output at the last position (equal to a pass's within float32 rounding).

    Raises:
        ValueError: the trace is not the clean prompt's, or switches heads off.
    """
    if tuple(int(i) for i in trace.token_ids) != tuple(int(i) for i in inputs.clean_ids):
        raise ValueError("The trace is not the clean prompt's: trace the clean prompt with the same model.")
    if trace.head_mask is not None and not np.asarray(trace.head_mask).all():
        raise ValueError("The clean prompt's trace switches heads off; patching needs the model with every head on.")
    dev = next(model.parameters()).device
    # (layer, head, q_pos, k_pos) @ (layer, head, k_pos, d_head): a new array (the trace's are read-only)
    z = torch.from_numpy(np.matmul(trace.weights, trace.values)).to(dev).transpose(1, 2).contiguous()
    hidden = torch.from_numpy(np.array(trace.hidden_states)).to(dev)  # (layer + 1, pos, d_model)
    dtype = next(model.parameters()).dtype
    metric = metric_of(family, model, hidden[-1, -1:].to(dtype), inputs)
    return float(metric[0]), z.to(dtype), hidden[:-1].to(dtype).clone()


def rank_correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation of two arrays (ties share their mean rank), over the pairs where both are
    finite; NaN with fewer than 3 such pairs or a constant side."""
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"Rank correlation needs two arrays of one size, not {x.size} and {y.size}.")
    keep = np.isfinite(x) & np.isfinite(y)
    if keep.sum() < 3:
        return float("nan")
    rx, ry = _ranks(x[keep]), _ranks(y[keep])
    rx, ry = rx - rx.mean(), ry - ry.mean()
    denom = np.sqrt((rx * rx).sum() * (ry * ry).sum())
    return float((rx * ry).sum() / denom) if denom > 0 else float("nan")


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties given the mean of the ranks they span."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(1, len(values) + 1)
    uniq, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    if len(uniq) == len(values):
        return ranks
    sums = np.bincount(inverse, weights=ranks)
    return (sums / counts)[inverse]
