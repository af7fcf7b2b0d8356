"""A circuit's metric: the clean prompts run with every edge outside the circuit carrying the corrupted run's sender
output, and the faithfulness curve over ``FRACTIONS``.

One pass a circuit: hooks on the senders' outputs record Δ_u = z_u − z_u^corrupt as the pass goes (z_u this patched
run's own output), and hooks on the receivers' inputs subtract Σ_{u: (u→v) ∉ C} Δ_u. Senders always come before their
receivers, so each receiver sees every Δ it needs. The sum is taken as (Σ_{u upstream} Δ_u) − Σ_{u: (u→v) ∈ C} Δ_u
when the circuit holds fewer of a group's edges than it leaves out, so a small circuit costs a small product.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.circuits.eap import (
    CircuitModel,
    PairBatch,
    as_rows,
    from_rows,
    metric,
    receiver_hooks,
    receiver_points,
    receiver_rows,
    sender_points,
    sender_rows,
    sender_run,
    sum_dtype,
)
from model_core.circuits.faithfulness import FRACTIONS, faithfulness
from model_core.circuits.graph import EdgeScores
from model_core.circuits.result import FaithfulnessCurve
from model_core.families.hooked import run_with_hooks
from model_core.gate import GATE
from model_core.kernel import on_device

Stop = Callable[[], bool]


@dataclass(frozen=True, eq=False)
class _Step:
    """What one group of receivers (a layer's head inputs, an MLP, the logits) loses in a patched pass.

    form "out" sums the Δ of the senders whose edges the circuit leaves out; "in" subtracts the kept edges' Δ from
    the sum of every upstream Δ (cheaper when the circuit keeps fewer). ``senders``: the few senders the matrix
    reads (their rows are gathered), or None to read the whole upstream prefix in place.

    Shape: matrix (receivers of the group, senders read), ``cm.dtype``.
    """

    form: str
    matrix: torch.Tensor
    senders: torch.Tensor | None
    up: int


GATHER_BELOW = 0.25
"""Gather the senders a group reads when they are under this share of its upstream; else read the prefix in place."""


def _groups(cm: CircuitModel) -> dict[str, tuple[str, slice, int]]:
    """Receiver point -> (its group, the group's receivers, the rows of the group's result it takes): a layer's q, k
    and v inputs form one group (one product serves all three: no sender writes between them)."""
    graph = cm.graph
    out: dict[str, tuple[str, slice, int]] = {}
    for point in receiver_points(cm.n_layers):
        cols = receiver_rows(graph, point)
        if cols.step == 3:  # a head input: the layer's 3H head receivers, q, k, v of head 0, then head 1...
            layer = int(point.split(".")[1])
            first = graph.head_receiver(layer, 0, "q")
            out[point] = (f"heads{layer}", slice(first, first + 3 * graph.n_heads), cols.start - first)
        else:
            out[point] = (point, cols, 0)
    return out


def _plan(cm: CircuitModel, keep: np.ndarray) -> dict[str, _Step | None]:
    """Each receiver group's ``_Step``, or None where the circuit keeps every edge into it; its matrices on the
    model's device (made once a circuit, on the host, and moved there).

    Shape: keep (n_senders, n_receivers) bool.
    """
    device = cm.device
    graph = cm.graph
    plan: dict[str, _Step | None] = {}
    for group, cols, _ in _groups(cm).values():
        if group in plan:
            continue
        up = int(graph.upstream[cols.start])
        edges = graph.mask[:up, cols]
        kept = keep[:up, cols] & edges
        out = edges & ~kept
        if not out.any():
            plan[group] = None
            continue
        form, chosen = ("in", kept) if kept.sum() < out.sum() else ("out", out)
        matrix = torch.from_numpy(np.ascontiguousarray(chosen.T)).to(cm.dtype)  # (receivers, up)
        used = np.flatnonzero(chosen.any(axis=1))
        senders = torch.from_numpy(used) if len(used) < GATHER_BELOW * up else None
        if senders is not None:
            matrix = matrix[:, senders].contiguous()
        plan[group] = _Step(form, on_device(matrix, device), None if senders is None else on_device(senders, device),
                            up)
    return plan


def patched_metric(cm: CircuitModel, batch: PairBatch, corrupt: torch.Tensor, keep: np.ndarray | dict) -> torch.Tensor:
    """M on the clean prompts with every edge outside ``keep`` carrying the corrupted run's sender output.

    Every tensor of the pass stays on the model's device, and so does the result.

    Args:
        corrupt: the corrupted run's sender outputs (``sender_run(...).senders``).
        keep: the circuit, shape (n_senders, n_receivers) bool; or its plan (``_plan``), made once for many batches.

    Shape: corrupt (n_senders, batch·pos·d_model) -> (batch,).
    """
    graph = cm.graph
    plan = keep if isinstance(keep, dict) else _plan(cm, keep)
    batch = batch.to(corrupt.device)
    if all(step is None for step in plan.values()):  # the full graph: the clean run itself
        out = run_with_hooks(cm.model, batch.clean)
        return metric(out.logits, batch.answer, batch.foil).to(dtype=corrupt.dtype)
    groups = _groups(cm)
    delta = torch.zeros_like(corrupt)  # (n_senders, N): Δ_u of this pass
    total = torch.zeros(corrupt.shape[1], dtype=corrupt.dtype, device=corrupt.device)  # Σ of the Δ recorded so far
    done: dict[str, torch.Tensor] = {}  # each group's loss, (receivers, N), once per pass

    def record(t: torch.Tensor, point: Any) -> None:
        rows = sender_rows(graph, point.name)
        d = torch.sub(as_rows(t), corrupt[rows], out=delta[rows])  # the model's dtype promoted to the stack's
        total.add_(d.sum(dim=0))

    def loss(group: str) -> torch.Tensor:
        step = plan[group]
        if step.senders is None:
            part = step.matrix @ delta[:step.up]  # the prefix, read in place
        elif len(step.senders):
            part = step.matrix @ delta[step.senders]
        else:
            part = torch.zeros(step.matrix.shape[0], delta.shape[1], dtype=delta.dtype, device=delta.device)
        # "in": the senders recorded so far are exactly this group's upstream (senders come before receivers)
        return total[None, :] - part if step.form == "in" else part

    def subtract(t: torch.Tensor, point: Any) -> torch.Tensor | None:
        group, _cols, first = groups[point.name]
        if plan[group] is None:
            return None
        if group not in done:
            done[group] = loss(group)
        rows = done[group][first::3] if t.dim() == 4 else done[group]  # a head input: its part, q, k or v
        return t - from_rows(rows, t).to(dtype=t.dtype)  # on the model's device already

    hooks = [*receiver_hooks(cm.n_layers), *((p, record) for p in sender_points(cm.n_layers)),
             *((p, subtract) for p in receiver_points(cm.n_layers))]
    out = run_with_hooks(cm.model, batch.clean, hooks=hooks)
    return metric(out.logits, batch.answer, batch.foil).to(dtype=corrupt.dtype)


def circuit_metrics(cm: CircuitModel, batches: Sequence[PairBatch], circuits: Sequence[np.ndarray], *,
                    progress: Callable[[float], None] | None = None, stop: Stop | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | None:
    """Σ over the pairs of m for each circuit, of the clean and of the corrupted metric; and the pairs run.

    One corrupted pass a batch records its senders; then one patched pass a circuit. The sums stay on the model's
    device and come to the host once, at the end. ``progress`` gets the share done (0..1); ``stop`` is asked before
    each batch, and a Stop returns None (a curve over part of the pairs is no curve of the dataset).

    Shape: circuits[i] (n_senders, n_receivers) bool -> (n_circuits,), (), (), int.
    """
    device = cm.device
    # [circuit 0 .. circuit k-1, clean, corrupt]: one tensor, one copy to the host
    sums = torch.zeros(len(circuits) + 2, dtype=sum_dtype(device), device=device)
    plans = [_plan(cm, keep) for keep in circuits]  # once a circuit, not once a batch
    n = 0
    total = sum(len(b) for b in batches)
    for batch in batches:
        if stop is not None and stop():
            return None
        batch = batch.to(device)
        with GATE.turn(), torch.no_grad():
            corrupt = sender_run(cm, batch.corrupt, batch)
            clean = run_with_hooks(cm.model, batch.clean)
            sums[-2] += metric(clean.logits, batch.answer, batch.foil).to(sums.dtype).sum()
            sums[-1] += corrupt.metric.to(sums.dtype).sum()
            for i, plan in enumerate(plans):
                sums[i] += patched_metric(cm, batch, corrupt.senders, plan).to(sums.dtype).sum()
                if progress is not None:
                    progress((n + len(batch) * (i + 1) / len(circuits)) / total)
        n += len(batch)
    host = sums.cpu().double().numpy()
    return host[:-2].copy(), np.float64(host[-2]), np.float64(host[-1]), n


def faithfulness_curve(cm: CircuitModel, batches: Sequence[PairBatch], scores: EdgeScores,
                       fractions: Sequence[float] = FRACTIONS, *, progress: Callable[[float], None] | None = None,
                       stop: Stop | None = None) -> FaithfulnessCurve | None:
    """Faithfulness at each fraction of the edges (the circuit: ``EdgeScores.circuit``), over ``batches``; None when
    stopped.

    Raises:
        ValueError: the clean and corrupted means are equal (``faithfulness``).
    """
    circuits = [scores.circuit(f) for f in fractions]
    got = circuit_metrics(cm, batches, circuits, progress=progress, stop=stop)
    if got is None:
        return None
    sums, clean, corrupt, n = got
    means = sums / n
    values = faithfulness(means, float(clean / n), float(corrupt / n))
    return FaithfulnessCurve(tuple(fractions), tuple(np.atleast_1d(values).tolist()), tuple(means.tolist()))
