"""The graph edge attribution scores: its nodes, its edges, and a circuit as the top edges by |score|.

Senders, in order: ``input`` (the embeddings), then per layer each head ``a{l}.h{h}`` (its write into the residual
stream) and the MLP ``m{l}``. Receivers, in order: per layer each head's query, key and value inputs
``a{l}.h{h}<q>``, ``<k>``, ``<v>`` (with grouped-query attention each *query* head has its own key and value
receivers), then the MLP ``m{l}``; last ``logits``.

An edge u → v exists when u writes into the residual stream v reads: the input and every sender of an earlier layer,
and for an MLP also the heads of its own layer (not in a parallel block, Phi-1/2, where attention and MLP read the
same input); ``logits`` reads every sender. Every receiver so reads a *prefix* of the senders (``Graph.upstream``),
which lets scores live in a dense sender × receiver matrix with a boolean mask of the edges. SmolLM2 (30 layers,
9 heads) has 123,211 edges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

HEAD_INPUTS = ("q", "k", "v")


def sender_names(n_layers: int, n_heads: int) -> tuple[str, ...]:
    """``input``, then per layer its heads and its MLP."""
    names = ["input"]
    for layer in range(n_layers):
        names += [f"a{layer}.h{head}" for head in range(n_heads)] + [f"m{layer}"]
    return tuple(names)


def receiver_names(n_layers: int, n_heads: int) -> tuple[str, ...]:
    """Per layer each head's <q>, <k>, <v>, then its MLP; last ``logits``."""
    names = []
    for layer in range(n_layers):
        names += [f"a{layer}.h{head}<{part}>" for head in range(n_heads) for part in HEAD_INPUTS] + [f"m{layer}"]
    return tuple(names + ["logits"])


def upstream_counts(n_layers: int, n_heads: int, parallel: bool = False) -> np.ndarray:
    """How many senders (a prefix of ``sender_names``) each receiver reads.

    Shape: -> (n_receivers,) int64.
    """
    counts = []
    for layer in range(n_layers):
        before = 1 + layer * (n_heads + 1)  # the input and every sender of an earlier layer
        counts += [before] * (3 * n_heads) + [before + (0 if parallel else n_heads)]
    return np.array(counts + [1 + n_layers * (n_heads + 1)], dtype=np.int64)


@dataclass(frozen=True, eq=False)
class Graph:
    """The nodes and edges of one model's attribution graph.

    Attributes:
        n_layers, n_heads: the model's layers and query heads a layer.
        parallel: attention and MLP read the same input (Phi-1/2): an MLP reads no head of its own layer.
        senders, receivers: the node names in order (the module docstring).
        mask: True where an edge u → v exists. Shape: (n_senders, n_receivers) bool, read-only.
        upstream: each receiver reads senders [0, upstream[r]). Shape: (n_receivers,).
    """

    n_layers: int
    n_heads: int
    parallel: bool = False
    senders: tuple[str, ...] = field(init=False, repr=False)
    receivers: tuple[str, ...] = field(init=False, repr=False)
    mask: np.ndarray = field(init=False, repr=False)
    upstream: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("n_layers", "n_heads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"A graph needs {name} ≥ 1, not {value!r}.")
        senders = sender_names(self.n_layers, self.n_heads)
        upstream = upstream_counts(self.n_layers, self.n_heads, self.parallel)
        mask = np.arange(len(senders))[:, None] < upstream[None, :]  # (sender, receiver)
        mask.flags.writeable = False
        upstream.flags.writeable = False
        object.__setattr__(self, "senders", senders)
        object.__setattr__(self, "receivers", receiver_names(self.n_layers, self.n_heads))
        object.__setattr__(self, "mask", mask)
        object.__setattr__(self, "upstream", upstream)

    @property
    def n_edges(self) -> int:
        """E: every edge of the full graph."""
        return int(self.upstream.sum())

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.senders), len(self.receivers)

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """(sender index, receiver index) of every edge, earlier sender first, then earlier receiver: the order ties
        are broken in. Shape: -> (E,), (E,)."""
        return np.nonzero(self.mask)

    def sender_index(self, name: str) -> int:
        return _index(self.senders, name, "sender")

    def receiver_index(self, name: str) -> int:
        return _index(self.receivers, name, "receiver")

    def head_sender(self, layer: int, head: int) -> int:
        """The index of ``a{layer}.h{head}`` among the senders."""
        return 1 + layer * (self.n_heads + 1) + head

    def mlp_sender(self, layer: int) -> int:
        return 1 + layer * (self.n_heads + 1) + self.n_heads

    def head_receiver(self, layer: int, head: int, part: str) -> int:
        """The index of ``a{layer}.h{head}<part>`` (part q, k or v) among the receivers."""
        return layer * (3 * self.n_heads + 1) + 3 * head + HEAD_INPUTS.index(part)

    def mlp_receiver(self, layer: int) -> int:
        return layer * (3 * self.n_heads + 1) + 3 * self.n_heads

    @property
    def logits_receiver(self) -> int:
        return len(self.receivers) - 1

    def sender_layer(self) -> np.ndarray:
        """Each sender's layer (-1 for ``input``). Shape: -> (n_senders,)."""
        return np.array([-1] + [layer for layer in range(self.n_layers) for _ in range(self.n_heads + 1)])

    def receiver_layer(self) -> np.ndarray:
        """Each receiver's layer (``n_layers`` for ``logits``). Shape: -> (n_receivers,)."""
        per = 3 * self.n_heads + 1
        return np.array([layer for layer in range(self.n_layers) for _ in range(per)] + [self.n_layers])


def _index(names: tuple[str, ...], name: str, kind: str) -> int:
    try:
        return names.index(name)
    except ValueError:
        raise ValueError(f"No {kind} {name!r} in this graph (e.g. {names[0]!r}, {names[-1]!r}).") from None


def edge_budget(fraction: float, n_edges: int) -> int:
    """⌈f·E⌉: the edges a circuit at fraction f keeps (f read as the decimal it is written as, so 0.1·E is not
    pushed over a whole number by binary rounding).

    Raises:
        ValueError: f outside [0, 1].
    """
    if not 0.0 <= float(fraction) <= 1.0 or math.isnan(float(fraction)):
        raise ValueError(f"An edge fraction is between 0 and 1, not {fraction!r}.")
    return min(n_edges, math.ceil(Fraction(repr(float(fraction))) * n_edges))


@dataclass(frozen=True, eq=False)
class EdgeScores:
    """A score on every edge of a graph.

    Attributes:
        graph: the graph.
        matrix: the scores; 0 off the graph's edges. Shape: (n_senders, n_receivers) float64, read-only.

    Raises:
        ValueError: a matrix of another shape, or NaN on an edge.
    """

    graph: Graph
    matrix: np.ndarray

    def __post_init__(self) -> None:
        matrix = np.array(self.matrix, dtype=np.float64)
        if matrix.shape != self.graph.shape:
            raise ValueError(f"Scores of shape {matrix.shape} for a graph of {self.graph.shape} (sender, receiver).")
        if np.isnan(matrix[self.graph.mask]).any():
            raise ValueError("Some edges have no score (NaN): score every edge before choosing a circuit.")
        matrix[~self.graph.mask] = 0.0
        matrix.flags.writeable = False
        object.__setattr__(self, "matrix", matrix)

    def values(self) -> np.ndarray:
        """Every edge's score in edge order (``Graph.edges``). Shape: -> (E,)."""
        return self.matrix[self.graph.mask]

    def ranking(self) -> np.ndarray:
        """Edge-order indices from the largest |score| down; ties go to the earlier sender, then the earlier
        receiver. Shape: -> (E,)."""
        return np.argsort(-np.abs(self.values()), kind="stable")

    def circuit(self, fraction: float) -> np.ndarray:
        """The circuit at edge fraction f: the top ⌈f·E⌉ edges by |score| (``edge_budget``, ``ranking``).

        Shape: -> (n_senders, n_receivers) bool.
        """
        return self.circuit_of_size(edge_budget(fraction, self.graph.n_edges))

    def circuit_of_size(self, k: int) -> np.ndarray:
        """The top ``k`` edges by |score| as a mask. Shape: -> (n_senders, n_receivers) bool."""
        senders, receivers = self.graph.edges()
        keep = self.ranking()[:max(0, int(k))]
        mask = np.zeros(self.graph.shape, dtype=bool)
        mask[senders[keep], receivers[keep]] = True
        return mask

    def top(self, k: int | None = None) -> list[tuple[str, str, float]]:
        """(sender, receiver, score) of the top ``k`` edges by |score| (every edge when None), largest first."""
        senders, receivers = self.graph.edges()
        order = self.ranking() if k is None else self.ranking()[:max(0, int(k))]
        values = self.values()
        return [(self.graph.senders[senders[i]], self.graph.receivers[receivers[i]], float(values[i]))
                for i in order]

    def edge_list(self) -> list[tuple[str, str, float]]:
        """(sender, receiver, score) of every edge, in edge order."""
        senders, receivers = self.graph.edges()
        return [(self.graph.senders[s], self.graph.receivers[r], float(v))
                for s, r, v in zip(senders, receivers, self.values())]

    def node_totals(self, mask: np.ndarray | None = None) -> dict[str, float]:
        """Per node, the sum of its edges' |scores| (edges in ``mask`` only, when given): a sender over the edges it
        sends, a receiver over the edges it receives; a name that is both (an MLP ``m{l}``) sums both."""
        weights = np.abs(self.matrix) * (self.graph.mask if mask is None else (mask & self.graph.mask))
        totals: dict[str, float] = {}
        for name, value in zip(self.graph.senders, weights.sum(axis=1)):
            totals[name] = totals.get(name, 0.0) + float(value)
        for name, value in zip(self.graph.receivers, weights.sum(axis=0)):
            totals[name] = totals.get(name, 0.0) + float(value)
        return totals
