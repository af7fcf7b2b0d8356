"""Circuits in a notebook and their figures: ``circuit(dataset, model=..., method=..., steps=...)`` runs edge
attribution (EAP or EAP-IG) over a dataset of prompt pairs and returns the edges, the faithfulness curve and their
figures; the figure builders are the ones the Circuits page draws (no streamlit here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go

from model_core.circuits.graph import EdgeScores, edge_budget

POSITIVE, NEGATIVE = "#1f77b4", "#d62728"
"""Edge colours: a positive score carries the clean answer, a negative one works against it."""
WIDTH_BINS = 4
MAX_DRAWN = 2000
"""The most edges the graph draws (the largest by |score|): beyond that it is a blur."""


def nothing_to_show(message: str, title: str = "") -> go.Figure:
    """A figure that says in its middle why it has nothing to draw (no trace, so no NaN reaches the browser)."""
    fig = go.Figure()
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font={"size": 14, "color": "#555"})
    fig.update_layout(title=title, height=260, xaxis={"visible": False}, yaxis={"visible": False},
                      margin={"t": 60 if title else 20})
    return fig


def _finite(value: float) -> str:
    return f"{value:.4f}" if np.isfinite(value) else "n/a"


def _node(name: str) -> str:
    """The node a receiver belongs to: a head's <q>, <k>, <v> inputs are drawn at the head."""
    return name.split("<")[0]


def node_position(name: str, n_layers: int, n_heads: int) -> tuple[float, float]:
    """(x, y) of a node: x its layer (the input at -1, an MLP half a layer after its heads, logits after the last
    layer), y its head (an MLP and the ends in the middle)."""
    middle = (n_heads - 1) / 2
    if name == "input":
        return -1.0, middle
    if name == "logits":
        return float(n_layers), middle
    if name.startswith("m"):
        return int(name[1:]) + 0.5, middle
    layer, head = name[1:].split(".h")
    return float(layer), float(head)


def circuit_graph_figure(scores: EdgeScores, fraction: float, *, title: str | None = None) -> go.Figure:
    """The circuit at edge fraction f as a graph: nodes by layer, only the circuit's edges, blue positive and red
    negative, widths by |score| (the largest ``MAX_DRAWN``). A head's q, k and v inputs are drawn at the head; the
    hover says which."""
    graph = scores.graph
    kept = edge_budget(fraction, graph.n_edges)
    edges = [(u, v, s) for u, v, s in scores.top(min(kept, MAX_DRAWN)) if np.isfinite(s) and s != 0]
    if not edges:  # every score 0 (clean and corrupted prompts alike) or none finite: no circuit to draw
        return nothing_to_show("Every edge scores 0 here, so there is no circuit to draw: the clean and corrupted "
                               "prompts give the same activations (or the same metric). Change a word of each "
                               "corrupted prompt.", title or f"The circuit at {fraction:g} of the edges")
    fig = go.Figure()
    top = max(abs(v) for _, _, v in edges) or 1.0
    groups: dict[tuple[bool, int], list] = {}
    mids_x, mids_y, mids_text = [], [], []
    nodes: dict[str, float] = {}
    for sender, receiver, value in edges:
        x0, y0 = node_position(sender, graph.n_layers, graph.n_heads)
        x1, y1 = node_position(_node(receiver), graph.n_layers, graph.n_heads)
        width_bin = min(WIDTH_BINS - 1, int(WIDTH_BINS * abs(value) / top))
        groups.setdefault((value >= 0, width_bin), []).append((x0, y0, x1, y1))
        mids_x.append((x0 + x1) / 2)
        mids_y.append((y0 + y1) / 2)
        mids_text.append(f"{sender} → {receiver}<br>score {value:+.4g}")
        for name in (sender, _node(receiver)):
            nodes[name] = nodes.get(name, 0.0) + abs(value)
    for (positive, width_bin), lines in sorted(groups.items()):
        xs, ys = [], []
        for x0, y0, x1, y1 in lines:
            xs += [x0, x1, None]
            ys += [y0, y1, None]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                 line={"color": POSITIVE if positive else NEGATIVE, "width": 0.6 + 1.6 * width_bin},
                                 opacity=0.35 + 0.15 * width_bin))
    fig.add_trace(go.Scatter(x=mids_x, y=mids_y, mode="markers", marker={"size": 6, "opacity": 0}, text=mids_text,
                             hovertemplate="%{text}<extra></extra>", showlegend=False))
    names = list(nodes)
    positions = [node_position(n, graph.n_layers, graph.n_heads) for n in names]
    weight = np.array([nodes[n] for n in names])
    fig.add_trace(go.Scatter(
        x=[p[0] for p in positions], y=[p[1] for p in positions], mode="markers+text", text=names,
        textposition="top center", textfont={"size": 9}, showlegend=False,
        marker={"size": 8 + 14 * weight / weight.max(), "color": "#444",
                "symbol": ["square" if n.startswith("m") else "circle" for n in names]},
        customdata=weight, hovertemplate="%{text}<br>Σ|score| in the circuit %{customdata:.4g}<extra></extra>"))
    for label, colour in (("positive (carries the clean answer)", POSITIVE), ("negative", NEGATIVE)):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line={"color": colour, "width": 3}, name=label))
    shown = f"{len(edges)} of {kept}" if kept > len(edges) else f"{kept}"
    fig.update_layout(
        title=title or f"The circuit at {fraction:g} of the edges: {shown} edges",
        xaxis={"title": "layer", "tickmode": "array", "tickvals": [-1, *range(graph.n_layers), graph.n_layers],
               "ticktext": ["in", *map(str, range(graph.n_layers)), "logits"], "zeroline": False},
        yaxis={"title": "head (MLPs in the middle)", "zeroline": False}, height=520, margin={"t": 60},
        legend={"orientation": "h", "y": -0.15})
    return fig


def faithfulness_figure(curve: Any) -> go.Figure:
    """Faithfulness against the edge fraction, with CPR and CMD (areas on the linear axis) and their log-axis
    variants in the title. The x axis is drawn on a log scale so the small fractions can be read."""
    pairs = [(float(f), float(v)) for f, v in zip(curve.fractions, curve.values) if np.isfinite(v)]
    if not pairs:
        return nothing_to_show("No faithfulness to draw: the curve has no finite value (the clean and corrupted "
                               "metrics are equal, or no fraction was run).", "Faithfulness")
    fig = go.Figure(go.Scatter(x=[f for f, _ in pairs], y=[v for _, v in pairs], mode="lines+markers",
                               hovertemplate="%{x:g} of the edges: faithfulness %{y:.3f}<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888")
    fig.add_hline(y=0.0, line_dash="dot", line_color="#888")
    fig.update_layout(
        title=(f"Faithfulness: CPR {_finite(curve.cpr)}, CMD {_finite(curve.cmd)} (areas on the linear axis, 0.001 to "
               f"1); log-axis CPR {_finite(curve.cpr_log)}, CMD {_finite(curve.cmd_log)}"),
        xaxis={"title": "fraction of the edges (drawn on a log scale)", "type": "log"},
        yaxis={"title": "faithfulness"}, height=380, margin={"t": 60})
    return fig


def node_totals(scores: EdgeScores, keep: np.ndarray | None = None) -> list[tuple[str, float]]:
    """Per node, the sum of its edges' |scores| (``keep``: the circuit's edges only), largest first; a head's q, k, v
    receivers count for the head."""
    totals: dict[str, float] = {}
    for name, value in scores.node_totals(keep).items():
        node = _node(name)
        totals[node] = totals.get(node, 0.0) + value
    return sorted(((n, v) for n, v in totals.items() if v > 0), key=lambda item: -item[1])


def node_totals_figure(scores: EdgeScores, keep: np.ndarray | None = None, top: int = 30) -> go.Figure:
    """The ``top`` nodes by the sum of their edges' |scores|."""
    rows = [(n, v) for n, v in node_totals(scores, keep)[:top] if np.isfinite(v)]
    if not rows:
        return nothing_to_show("No node has an edge with a score other than 0: nothing to rank.", "Nodes")
    fig = go.Figure(go.Bar(x=[v for _, v in rows][::-1], y=[n for n, _ in rows][::-1], orientation="h",
                           hovertemplate="%{y}: Σ|score| %{x:.4g}<extra></extra>"))
    fig.update_layout(title=f"The {len(rows)} nodes with the largest Σ|score| over their edges",
                      xaxis={"title": "Σ |score|"}, height=max(300, 18 * len(rows) + 100), margin={"t": 50})
    return fig


@dataclass(frozen=True, eq=False)
class Circuit:
    """What ``circuit`` returns: the edges, the faithfulness curve, and the page's figures.

    Attributes:
        result: ``model_core.circuits.result.CircuitResult`` (scores, curve, means, problems).
    """

    result: Any

    @property
    def edges(self) -> list[tuple[str, str, float]]:
        """(sender, receiver, score) of every edge, largest |score| first."""
        return self.result.scores.top()

    @property
    def curve(self) -> Any:
        """The faithfulness curve (fractions, values, cpr, cmd, cpr_log, cmd_log), or None."""
        return self.result.curve

    def graph_figure(self, fraction: float = 0.01) -> go.Figure:
        return circuit_graph_figure(self.result.scores, fraction)

    def faithfulness_figure(self) -> go.Figure:
        if self.result.curve is None:
            raise ValueError("This run has no faithfulness curve: call circuit(..., curve=True).")
        return faithfulness_figure(self.result.curve)

    def nodes_figure(self, fraction: float | None = None) -> go.Figure:
        keep = None if fraction is None else self.result.scores.circuit(fraction)
        return node_totals_figure(self.result.scores, keep)

    def figures(self, fraction: float = 0.01) -> dict[str, go.Figure]:
        """{"graph", "faithfulness" (when computed), "nodes"}."""
        out = {"graph": self.graph_figure(fraction), "nodes": self.nodes_figure(fraction)}
        if self.result.curve is not None:
            out["faithfulness"] = self.faithfulness_figure()
        return out

    def table(self) -> Any:
        """Every edge (sender, receiver, score, abs_score, rank) as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.result.edge_rows())

    def to_json(self, top: int | None = None) -> dict[str, Any]:
        return self.result.to_json(top)


def circuit(dataset: Any, *, model: str | None = None, method: str = "eap-ig", steps: int = 5,
            batch_size: int | None = None, curve: bool = True, device: str | None = None,
            progress: Any = None) -> Circuit:
    """Edge attribution over a dataset of prompt pairs, and the faithfulness of its circuits.

    Args:
        dataset: a JSONL or CSV file, a generator spec such as "ioi:64:0", a ``Dataset`` or a list of ``Pair``.
        model: a decoder's hub id, folder or bundled id (default: the bundled SmolLM2-135M-Instruct, offline).
        method: "eap" or "eap-ig"; steps: EAP-IG's points along the path (EAP uses 1).
        batch_size: pairs a pass (default 16 on a CPU, 64 on a GPU).
        progress: called with (share done, what is running).

    Raises:
        model_core.circuits.datasets.DatasetError: no pair can run (the message names the pairs and their pieces).
    """
    from model_core.circuits.run import circuit as run
    from model_core.settings import BUNDLED_DECODER_ID

    return Circuit(run(dataset, model_id=model or BUNDLED_DECODER_ID, method=method, steps=steps,
                       batch_size=batch_size, curve=curve, device=device, progress=progress))
