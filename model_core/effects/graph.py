"""The contribution graph of one token (Ferrando & Voita 2024): built backwards from the token at the top layer,
expanding only the nodes reached by edges above the threshold.

Nodes are residual-stream vectors, one per position at each stage: stage 0 is the embeddings (layer 0's resid_pre),
stage ``2l + 1`` layer ``l``'s resid_mid, stage ``2l + 2`` its resid_post. Edges:

- ``attention``: resid_pre of key ``j`` -> resid_mid of query ``i``, weight the (key, head) shares summed over heads
  (``heads`` keeps each head's share);
- ``attention_residual``: resid_pre of ``i`` -> resid_mid of ``i``;
- ``ffn`` and ``ffn_residual``: resid_mid of ``i`` -> resid_post of ``i`` (the MLP output, and the residual).

Each weight is after the renormalising threshold (``model_core.effects.contributions.renormalise``), so an edge
exists only where a share above the threshold survived.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from model_core.effects.contributions import renormalise
from model_core.effects.graph_flow import ContributionFlow, Stop, Superseded
from model_core.models.run_memory import after_out_of_memory, out_of_memory

LOG = logging.getLogger(__name__)
MIN_THRESHOLD = 0.01
"""The lowest threshold a graph is built at: every share is floored at ``EPS`` = 1e-5, so at 0 every term of every
row is "above" the threshold and the graph is the whole n² · H · layers model."""
KINDS = ("attention", "attention_residual", "ffn", "ffn_residual")
STAGE_NAMES = ("resid_pre", "resid_mid", "resid_post")


def stage_of(layer: int, kind: str) -> tuple[int, int]:
    """The (source, target) stages of an edge of ``kind`` in ``layer``."""
    if kind in ("attention", "attention_residual"):
        return 2 * layer, 2 * layer + 1
    return 2 * layer + 1, 2 * layer + 2


@dataclass(frozen=True, eq=False)
class ContributionGraph:
    """The graph of one token's prediction (or an encoder token's top-layer vector), thresholded.

    Attributes:
        tokens: the input's tokens.
        token: the position the graph starts from (resid_post of the last layer).
        threshold: the renormalising threshold.
        n_layers, n_heads: the model's.
        layer, kind, source, target, weight: one entry per edge (positions for source and target). Shape: (edge,).
        heads: an attention edge's share through each head (0 for other kinds). Shape: (edge, head).
    """

    tokens: tuple[str, ...]
    token: int
    threshold: float
    n_layers: int
    n_heads: int
    layer: np.ndarray
    kind: np.ndarray
    source: np.ndarray
    target: np.ndarray
    weight: np.ndarray
    heads: np.ndarray

    def __post_init__(self) -> None:
        assert len(self.layer) == len(self.kind) == len(self.source) == len(self.target) == len(self.weight)

    @property
    def n_edges(self) -> int:
        return len(self.weight)

    def edge_stages(self) -> tuple[np.ndarray, np.ndarray]:
        """Each edge's (source stage, target stage). Shape: (edge,) each."""
        pairs = [stage_of(int(la), str(k)) for la, k in zip(self.layer, self.kind)]
        return (np.array([p[0] for p in pairs], dtype=np.int64), np.array([p[1] for p in pairs], dtype=np.int64))

    def nodes(self) -> list[tuple[int, int]]:
        """Every node in the graph as (stage, position), the start included, sorted."""
        src, dst = self.edge_stages()
        found = {(2 * self.n_layers, self.token)}
        found |= set(zip(src.tolist(), self.source.tolist())) | set(zip(dst.tolist(), self.target.tolist()))
        return sorted(found)

    def positions(self, layer: int) -> list[int]:
        """The query positions whose resid_mid at ``layer`` is in the graph (rows of the layer's head maps)."""
        return sorted({s for st, s in self.nodes() if st == 2 * layer + 1})

    def edge_rows(self) -> list[dict[str, Any]]:
        """One dict per edge (the CSV's rows): layer, kind, from/to position and token, weight, per-head shares."""
        rows = []
        for e in range(self.n_edges):
            row = {"layer": int(self.layer[e]), "kind": str(self.kind[e]), "from": int(self.source[e]),
                   "from_token": self.tokens[int(self.source[e])], "to": int(self.target[e]),
                   "to_token": self.tokens[int(self.target[e])], "weight": float(self.weight[e])}
            row |= {f"head_{h}": float(self.heads[e, h]) for h in range(self.n_heads)}
            rows.append(row)
        return rows

    def to_json(self) -> dict[str, Any]:
        """The graph as plain JSON: tokens, the start, the threshold, the nodes and the edges."""
        nodes = [{"stage": s, "layer": (s - 1) // 2 if s else -1, "kind": _stage_name(s), "position": p}
                 for s, p in self.nodes()]
        edges = [{k: v for k, v in row.items() if not k.startswith("head_") and not k.endswith("_token")}
                 | ({"heads": self.heads[e].tolist()} if self.kind[e] == "attention" else {})
                 for e, row in enumerate(self.edge_rows())]
        return {"tokens": list(self.tokens), "token": self.token, "threshold": self.threshold,
                "n_layers": self.n_layers, "n_heads": self.n_heads, "nodes": nodes, "edges": edges}

    def dumps(self) -> str:
        return json.dumps(self.to_json())


def _stage_name(stage: int) -> str:
    return "resid_pre" if stage == 0 else ("resid_mid" if stage % 2 else "resid_post")


def check_threshold(threshold: float) -> None:
    """Raise ``ValueError`` unless ``MIN_THRESHOLD <= threshold < 1``, saying why and what to pick."""
    if not MIN_THRESHOLD <= threshold < 1.0:
        raise ValueError(f"The threshold must be in [{MIN_THRESHOLD}, 1), got {threshold}: below {MIN_THRESHOLD} "
                         "every share (floored at 1e-5) passes and the graph is the whole model; pick 0.01 or more.")


def build_graph(flow: ContributionFlow, token: int, threshold: float, stop: Stop | None = None) -> ContributionGraph:
    """Walk backwards from ``token``'s last resid_post, expanding only nodes reached by edges above ``threshold``.

    Args:
        stop: asked between chunks of nodes; True stops the walk (``Superseded``), for a background prefetch.

    Raises:
        ValueError: the token or threshold is out of range (the message gives the range).
        Superseded: ``stop`` said so.
    """
    n = flow.n_tokens
    if not -n <= token < n:
        raise ValueError(f"Token {token} is out of range: pick 0-{n - 1} (or -1 for the last).")
    check_threshold(threshold)
    token = token % n
    edges: list[tuple] = []
    heads: list[np.ndarray] = []
    zero = np.zeros(flow.n_heads, dtype=np.float32)
    reached = [token]
    for layer in reversed(range(flow.n_layers)):
        mids = _mlp_step(flow, layer, reached, threshold, edges, heads, zero, stop)
        reached = _attention_step(flow, layer, mids, threshold, edges, heads, zero, stop)
    if not edges:
        empty = np.zeros(0)
        return ContributionGraph(flow.tokens, token, threshold, flow.n_layers, flow.n_heads, empty.astype(np.int64),
                                 empty.astype(str), empty.astype(np.int64), empty.astype(np.int64),
                                 empty.astype(np.float32), np.zeros((0, flow.n_heads), dtype=np.float32))
    layer, kind, src, dst, weight = zip(*edges)
    return ContributionGraph(flow.tokens, token, threshold, flow.n_layers, flow.n_heads,
                             np.array(layer, dtype=np.int64), np.array(kind), np.array(src, dtype=np.int64),
                             np.array(dst, dtype=np.int64), np.array(weight, dtype=np.float32), np.stack(heads))


def _mlp_step(flow, layer, positions, threshold, edges, heads, zero, stop) -> list[int]:
    """The MLP block's edges into the reached resid_post nodes; the resid_mid positions they reach."""
    if not positions:
        return []
    found = flow.mlp(layer, positions, stop)
    ffn, res = renormalise(np.array([[f] for f, _ in found]), np.array([r for _, r in found]), threshold)
    mids = []
    for p, f, r in zip(positions, ffn[:, 0].tolist(), res.tolist()):
        for kind, w in (("ffn", f), ("ffn_residual", r)):
            if w > 0:
                edges.append((layer, kind, p, p, w))
                heads.append(zero)
        if f > 0 or r > 0:
            mids.append(p)
    return mids


def _attention_step(flow, layer, positions, threshold, edges, heads, zero, stop) -> list[int]:
    """The attention block's edges into the reached resid_mid nodes; the resid_pre positions they reach."""
    if not positions:
        return []
    reached: set[int] = set()
    for p, (terms, res) in zip(positions, flow.attention(layer, positions, stop)):
        kept, kept_res = renormalise(terms[None], np.array([res]), threshold)
        per_key = kept[0].sum(0)  # (key,): heads summed only after the threshold
        for j in np.flatnonzero(per_key).tolist():
            edges.append((layer, "attention", j, p, float(per_key[j])))
            heads.append(kept[0][:, j].copy())
            reached.add(j)
        if kept_res[0] > 0:
            edges.append((layer, "attention_residual", p, p, float(kept_res[0])))
            heads.append(zero)
            reached.add(p)
    return sorted(reached)


PREFETCH_FACTOR = 0.5
"""``prefetch`` computes the nodes a graph reaches at this fraction of its threshold."""


def prefetch(flow: ContributionFlow, token: int, threshold: float, stop: Stop | None = None) -> None:
    """Compute and keep the nodes the graph of ``token`` reaches at ``PREFETCH_FACTOR × threshold`` (never below
    ``MIN_THRESHOLD``), so that lowering the threshold that far only re-runs the walk. Meant for a background thread
    (``Prefetcher``): the flow's lock, taken a chunk of nodes at a time, serialises it with the page's walks.

    Raises:
        Superseded: ``stop`` said so.
    """
    build_graph(flow, token, max(MIN_THRESHOLD, threshold * PREFETCH_FACTOR), stop)


class Prefetcher:
    """At most one background prefetch of one flow at a time; a newer request supersedes the one running (it stops
    at its next chunk of nodes) and a request already done is not run again.

    Args:
        flow: the ``ContributionFlow``.
    """

    def __init__(self, flow: ContributionFlow) -> None:
        self.flow = flow
        self._lock = threading.Lock()
        self._wanted: tuple[int, float] | None = None
        self._thread: threading.Thread | None = None
        self.done: set[tuple[int, float]] = set()

    def request(self, token: int, threshold: float) -> None:
        """Prefetch for (``token``, ``threshold``): starts the one thread if none runs, else hands it this request."""
        key = (int(token), round(float(threshold), 4))
        with self._lock:
            if key in self.done or threshold <= MIN_THRESHOLD:  # nothing lower to fetch
                return
            self._wanted = key
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="graph-prefetch", daemon=True)
                self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread (tests)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _superseded(self) -> bool:
        return self._wanted is not None

    def _run(self) -> None:
        while True:
            with self._lock:
                key, self._wanted = self._wanted, None
                if key is None:
                    self._thread = None
                    return
            try:
                prefetch(self.flow, key[0], key[1], self._superseded)
                with self._lock:
                    self.done.add(key)
            except Superseded:
                continue
            except Exception as exc:  # a background thread has no caller to tell: log it
                if out_of_memory(exc):  # the page's own walk will say it, if it meets it; the GPU's blocks go back
                    LOG.warning("prefetching the contribution graph: %s", after_out_of_memory(exc))
                    continue
                LOG.exception("prefetching the contribution graph failed")
