"""What a circuit run gives: the edge scores over a dataset, the clean and corrupted means, and the faithfulness
curve; its JSON (the ``circuit`` verb's), a CSV of every edge, and the circuit at one fraction as JSON."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from model_core.circuits import faithfulness
from model_core.circuits.faithfulness import FRACTIONS
from model_core.circuits.graph import EdgeScores, edge_budget
from model_core.io.tables import (
    rows_to_csv,  # the one CSV writer (it imports nothing of model_core)
)

METHODS = ("eap", "eap-ig")


def _number(value: float) -> float | None:
    """A float for JSON at full precision; NaN and infinities as null (JSON has none)."""
    value = float(value)
    return value if math.isfinite(value) else None


def _area(measure: Callable[[Sequence[float], Sequence[float]], float], doc: str) -> property:
    """A read-only property: ``measure``, one of ``faithfulness``'s areas, of the curve's values over its fractions."""
    return property(lambda curve: measure(curve.values, curve.fractions), doc=doc)


@dataclass(frozen=True, eq=False)
class FaithfulnessCurve:
    """Faithfulness F at each edge fraction, and the areas computed from those same values.

    Attributes:
        fractions: the edge fractions (``FRACTIONS``).
        values: F at each fraction.
        metrics: m(C) at each fraction, the mean metric of the circuit's run (NaN where not kept).
    """

    fractions: tuple[float, ...]
    values: tuple[float, ...]
    metrics: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "fractions", tuple(float(f) for f in self.fractions))
        object.__setattr__(self, "values", tuple(float(v) for v in self.values))
        object.__setattr__(self, "metrics", tuple(float(v) for v in self.metrics))
        if len(self.values) != len(self.fractions):
            raise ValueError(f"{len(self.values)} faithfulness values for {len(self.fractions)} fractions.")

    cpr = _area(faithfulness.cpr, "The area under F on a linear axis from the first fraction to the last.")
    cmd = _area(faithfulness.cmd, "The area under |1 − F| on the same axis.")
    cpr_log = _area(faithfulness.cpr_log, "MIB's log-axis variant of CPR: shown beside, never instead.")
    cmd_log = _area(faithfulness.cmd_log, "MIB's log-axis variant of CMD: shown beside, never instead.")

    def to_json(self) -> dict[str, Any]:
        """{"fractions", "faithfulness", "cpr", "cmd"}; cpr and cmd from the values as printed."""
        values = [_number(v) for v in self.values]
        finite = all(v is not None for v in values)
        return {"fractions": list(self.fractions), "faithfulness": values,
                "cpr": _number(faithfulness.cpr(values, self.fractions)) if finite else None,
                "cmd": _number(faithfulness.cmd(values, self.fractions)) if finite else None}


@dataclass(frozen=True, eq=False)
class CircuitResult:
    """Edge attribution over a dataset, and the faithfulness of its circuits.

    Attributes:
        n: the pairs run. clean, corrupt: the mean metric M over them on the clean and the corrupted prompts.
        method: "eap" or "eap-ig". steps: m, the gradient's points along the path (1 for EAP).
        scores: every edge's score (mean over pairs of the per-pair sums over positions).
        curve: the faithfulness curve, or None when it was not computed.
        problems: a line for every pair that did not run ("pair 3 (row 3): ...").
        partial: a Stop ended the run early; ``n`` counts the pairs done.
    """

    n: int
    clean: float
    corrupt: float
    method: str
    steps: int
    scores: EdgeScores
    curve: FaithfulnessCurve | None = None
    problems: tuple[str, ...] = ()
    partial: bool = False

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"The method is one of {', '.join(METHODS)}, not {self.method!r}.")
        if isinstance(self.steps, bool) or not isinstance(self.steps, (int, np.integer)) or self.steps < 1:
            raise ValueError(f"steps is a whole number ≥ 1, not {self.steps!r}.")

    def to_json(self, top: int | None = None) -> dict[str, Any]:
        """The command line's JSON: {"n", "clean", "corrupt", "method", "steps", "edges": [[sender, receiver,
        score], ...] (every edge in edge order, or the top ``top`` by |score|, largest first), "faithfulness":
        {"fractions", "faithfulness", "cpr", "cmd"} (null when not computed)}. Every float at full precision."""
        edges = self.scores.edge_list() if top is None else self.scores.top(top)
        return {"n": int(self.n), "clean": _number(self.clean), "corrupt": _number(self.corrupt),
                "method": self.method, "steps": int(self.steps),
                "edges": [[s, r, _number(v)] for s, r, v in edges],
                "faithfulness": None if self.curve is None else self.curve.to_json()}

    def edge_rows(self) -> list[dict[str, Any]]:
        """Every edge as a row {"sender", "receiver", "score", "abs_score", "rank"} in edge order; rank 1 is the
        largest |score| (ties to the earlier sender, then receiver)."""
        ranks = np.empty(self.scores.graph.n_edges, dtype=np.int64)
        ranks[self.scores.ranking()] = np.arange(1, len(ranks) + 1)
        return [{"sender": s, "receiver": r, "score": v, "abs_score": abs(v), "rank": int(rank)}
                for (s, r, v), rank in zip(self.scores.edge_list(), ranks)]

    def edges_csv(self) -> str:
        """Every edge (``edge_rows``) as CSV, every score at full precision."""
        return rows_to_csv(self.edge_rows())

    def circuit_json(self, fraction: float) -> dict[str, Any]:
        """The circuit at edge fraction f: {"fraction", "n_edges" (E), "kept" (⌈f·E⌉), "method", "steps", "n",
        "edges": [[sender, receiver, score], ...] largest |score| first, "nodes": the nodes its edges touch, in
        graph order, "faithfulness": F at f when the curve has that fraction (else null)}."""
        graph = self.scores.graph
        kept = edge_budget(fraction, graph.n_edges)
        edges = self.scores.top(kept)
        touched = {name for s, r, _ in edges for name in (s, r)}
        nodes = [n for n in graph.senders if n in touched] + [n for n in graph.receivers if n in touched
                                                              and n not in graph.senders]
        at = None
        if self.curve is not None and float(fraction) in self.curve.fractions:
            at = _number(self.curve.values[self.curve.fractions.index(float(fraction))])
        return {"fraction": float(fraction), "n_edges": graph.n_edges, "kept": kept, "method": self.method,
                "steps": int(self.steps), "n": int(self.n), "edges": [[s, r, _number(v)] for s, r, v in edges],
                "nodes": nodes, "faithfulness": at}


def default_curve(values: list[float], metrics: list[float] | None = None) -> FaithfulnessCurve:
    """A curve at ``FRACTIONS``."""
    return FaithfulnessCurve(FRACTIONS, tuple(values), tuple(metrics or ()))
