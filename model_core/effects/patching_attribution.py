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

from model_core.effects.patching import PatchRuns, metric_of, resid_hooks
from model_core.families import Family
from model_core.trace.gate import GATE


@dataclass(frozen=True, eq=False)
class AttributionPatching:
    """Attribution patching's estimated effects, normalised like exact patching's.

    Shape: heads (layer, head); residual (layer, pos).
    """

    heads: np.ndarray
    residual: np.ndarray
    metric: float
    """The corrupted run's metric in the gradient pass (equals ``PatchRuns.corrupt``)."""


def attribution_patching(family: Family, model: Any, runs: PatchRuns) -> AttributionPatching:
    """One forward pass of the corrupted prompt with autograd (``Family.forward(grad=True)``), reading every head's
    ``z`` and every layer's ``resid_pre``, and one backward pass of the metric to them.

    The model's weights stay frozen: the graph starts at the first block's input, made a leaf for this pass, and
    ``torch.autograd.grad`` takes the gradients of these activations alone (nothing is written into the shared
    model's ``.grad``).

    Shape: -> heads (layer, head), residual (layer, pos).
    """
    z: dict[int, torch.Tensor] = {}
    resid: dict[int, torch.Tensor] = {}

    def read_z(layer: int, value: torch.Tensor) -> None:
        z[layer] = value  # in the graph: the gradient reaches it through the output projection
        return None

    def read_resid(layer: int, value: torch.Tensor) -> torch.Tensor | None:
        if layer == 0:
            value = value.detach().requires_grad_(True)  # the graph's leaf; later layers hang off it
            resid[0] = value
            return value
        resid[layer] = value
        return None

    dev = next(model.parameters()).device
    ids = torch.as_tensor(runs.inputs.corrupt_ids, dtype=torch.long, device=dev)[None]
    with GATE.turn(), torch.enable_grad(), resid_hooks(family, model, read_resid):
        out = family.forward(model, ids, torch.zeros_like(ids), None, vectors=False, hidden="last", grad=True,
                             edit_z=read_z)
        metric = metric_of(family, model, out.hidden[-1][:, -1], runs.inputs)[0]
        layers = range(runs.n_layers)
        grads = torch.autograd.grad(metric, [z[i] for i in layers] + [resid[i] for i in layers])
    with torch.no_grad():
        dz = torch.stack([g[0] for g in grads[:runs.n_layers]]).to(runs.z_clean.dtype)  # (layer, pos, head, d_head)
        dr = torch.stack([g[0] for g in grads[runs.n_layers:]]).to(runs.resid_clean.dtype)  # (layer, pos, d_model)
        heads = ((runs.z_clean - runs.z_corrupt) * dz).sum(dim=(1, 3))  # (layer, head)
        residual = ((runs.resid_clean - runs.resid_corrupt) * dr).sum(dim=-1)  # (layer, pos)
    scale = runs.denominator
    return AttributionPatching(heads.double().cpu().numpy() / scale, residual.double().cpu().numpy() / scale,
                               float(metric.detach()))


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
