"""What a compressed KV cache keeps, in figures: the KV cache page's builders and the notebook's ``kv``.

Every figure takes a result of ``model_core.generate.kv`` (or ``needle``) and draws it; none runs a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attention_explorer.figures import layer_head_figure
from model_core.generate.kv import KVResult
from model_core.generate.kv_batch import KVSweep
from model_core.generate.needle import NeedleResult
from model_core.generate.presses import N_SINK, PRESS_TITLES, WINDOW

KEPT_COLOURS = [[0.0, "#e9ecef"], [0.5, "#e9ecef"], [0.5, "#1f77b4"], [1.0, "#1f77b4"]]
"""Dropped keys pale grey, kept keys blue."""
MAX_STACKED = 8
"""The most key/value heads ``kept_keys_figure`` stacks in one figure; past it, pick one."""


def kept_mask(result: KVResult) -> np.ndarray:
    """Which prefill positions each key/value head keeps. Shape: -> (layer, kv_head, n_prefill) bool."""
    n_layers, n_kv, _ = result.kept.shape
    mask = np.zeros((n_layers, n_kv, result.n_prefill), dtype=bool)
    for layer in range(n_layers):
        for g in range(n_kv):
            mask[layer, g, result.kept[layer, g]] = True
    return mask


def kept_keys_figure(result: KVResult, kv_head: int | None = None, *, title: str = "") -> go.Figure:
    """Layer x position images of the kept keys: one per key/value head stacked (``kv_head`` None, up to
    ``MAX_STACKED``), or the one ``kv_head``. The first tokens (StreamingLLM's sinks) and the recent window
    (SnapKV's 64 queries) are marked above the image.

    Raises:
        ValueError: ``kv_head`` is out of range, or None with more than ``MAX_STACKED`` key/value heads.
    """
    mask = kept_mask(result)
    n_layers, n_kv, n = mask.shape
    if kv_head is not None and not 0 <= kv_head < n_kv:
        raise ValueError(f"Key/value head {kv_head} does not exist: this model has 0-{n_kv - 1}.")
    if kv_head is None and n_kv > MAX_STACKED:
        raise ValueError(f"{n_kv} key/value heads are too many to stack; pass kv_head=0..{n_kv - 1}.")
    heads = list(range(n_kv)) if kv_head is None else [kv_head]
    fig = make_subplots(rows=len(heads), cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        subplot_titles=[f"key/value head {g}" for g in heads])
    for row, g in enumerate(heads, start=1):
        fig.add_trace(go.Heatmap(z=mask[:, g].astype(np.float32), zmin=0, zmax=1, colorscale=KEPT_COLOURS,
                                 showscale=False, hovertemplate="layer %{y}, position %{x}<extra></extra>"),
                      row=row, col=1)
        fig.update_yaxes(title_text="layer", autorange="reversed", row=row, col=1)
    fig.update_xaxes(title_text="key position (prefill)", row=len(heads), col=1)
    for x0, x1, label in ((-0.5, min(N_SINK, n) - 0.5, "first tokens"), (max(n - WINDOW, 0) - 0.5, n - 0.5,
                                                                          "recent window")):
        fig.add_vrect(x0=x0, x1=x1, line_width=1, line_dash="dot", line_color="#d62728", fillcolor="rgba(0,0,0,0)",
                      annotation_text=label, annotation_position="top left", annotation_font_size=10)
    head = title or (f"{PRESS_TITLES[result.press]} at ratio {result.ratio:g}: {result.n_kept} of "
                     f"{result.n_prefill} keys kept per key/value head (blue)")
    fig.update_layout(title=head, height=110 + len(heads) * max(140, 9 * n_layers), template="plotly_white",
                      margin={"l": 60, "r": 20, "t": 70, "b": 50})
    return fig


def retained_figure(result: KVResult, *, clickable: bool = False) -> go.Figure:
    """Each query head's share of the last token's full-cache attention on its kept keys (the app's layer x head
    grid, 0-1)."""
    return layer_head_figure(result.retained, f"Retained attention ({PRESS_TITLES[result.press]}, ratio "
                                              f"{result.ratio:g})", zmin=0.0, zmax=1.0, colorscale="Blues",
                             colorbar="share", clickable=clickable)


def sweep_figure(result: KVSweep) -> go.Figure:
    """KL(full ‖ compressed) in nats against the compression ratio, one line per policy (log scale; a KL below
    1e-6 is drawn at 1e-6)."""
    fig = go.Figure()
    for i, press in enumerate(result.presses):
        kl = np.maximum(result.kl[i], 1e-6)
        changed = ["top token changed" if c else "same top token" for c in result.top_changed[i]]
        fig.add_trace(go.Scatter(x=list(result.ratios), y=kl, mode="lines+markers", name=PRESS_TITLES[press],
                                 customdata=np.stack([result.kl[i], result.retained[i]], -1), text=changed,
                                 marker={"symbol": ["x" if c else "circle" for c in result.top_changed[i]]},
                                 hovertemplate="ratio %{x}<br>KL %{customdata[0]:.4g} nats<br>mean retained "
                                               "%{customdata[1]:.3f}<br>%{text}<extra>%{fullData.name}</extra>"))
    fig.update_layout(title="Budget sweep: next-token KL(full ‖ compressed); × = top token changed",
                      xaxis_title="compression ratio (share of keys dropped)", yaxis_title="KL (nats)",
                      yaxis_type="log", height=420, template="plotly_white", legend={"orientation": "h", "y": -0.2})
    return fig


def needle_figure(result: NeedleResult) -> go.Figure:
    """Policy x ratio: whether the model still decodes the needle's answer (green) or not (red); the decoded text
    on hover."""
    z = result.passed.astype(np.float32)
    text = np.vectorize(lambda a: "✓" if a else "✗")(result.passed)
    answers = np.vectorize(lambda a: repr(str(a)))(result.answers)
    fig = go.Figure(go.Heatmap(z=z, x=[f"{r:g}" for r in result.ratios], y=[PRESS_TITLES[p] for p in result.presses],
                               zmin=0, zmax=1, colorscale=[[0, "#f8d7da"], [1, "#d1e7dd"]], showscale=False,
                               text=text, texttemplate="%{text}", customdata=answers,
                               hovertemplate="%{y} at %{x}<br>answer: %{customdata}<extra></extra>"))
    full = "answers" if result.full_passed else "does NOT answer"
    fig.update_layout(title=f"Needle test ({result.n_tokens} tokens): the full cache {full} "
                            f"({result.full_answer.strip()!r})", xaxis_title="compression ratio",
                      yaxis={"autorange": "reversed"}, height=320, template="plotly_white")
    return fig


@dataclass(frozen=True, eq=False)
class KVReport:
    """A policy at a ratio on one text, with its figures (the notebook's ``kv``).

    Attributes:
        result: kept positions (layer, kv_head, n_kept), retained shares (layer, head), KL and top tokens.
        kept_figure, retained_figure: the page's two figures.
    """

    result: KVResult
    kept_figure: go.Figure
    retained_figure: go.Figure

    @property
    def kept(self) -> np.ndarray:
        return self.result.kept

    @property
    def retained(self) -> np.ndarray:
        return self.result.retained

    @property
    def kl(self) -> float:
        return self.result.next_token_kl

    def __repr__(self) -> str:
        r = self.result
        return (f"<KV {r.press} at {r.ratio:g}: {r.n_kept}/{r.n_prefill} keys per key/value head, KL {r.next_token_kl:.4g}"
                f" nats, top token {r.text_full!r} -> {r.text_compressed!r}>")


def kv(trace_core: Any, model: Any, family: Any, press: str = "snapkv", ratio: float = 0.5, *,
       tokenizer: Any = None) -> KVReport:
    """Compress the KV cache of the traced text with ``press`` at ``ratio``: the kept positions, retained shares,
    KL and figures. The scores read the trace (full or compact); the cache comes from one prefill pass.

    Raises:
        ValueError: an encoder's trace, an unknown press, a ratio outside (0, 1), or heads switched off.
    """
    from model_core.generate.kv import kv_compress
    from model_core.generate.kv_sources import source_of

    result = kv_compress(family, model, np.asarray(trace_core.token_ids), press, ratio, source=source_of(trace_core),
                         tokenizer=tokenizer)
    n_kv = result.kept.shape[1]
    return KVReport(result, kept_keys_figure(result, None if n_kv <= MAX_STACKED else 0), retained_figure(result))
