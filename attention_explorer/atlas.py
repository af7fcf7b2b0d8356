"""The head atlas's figures and HTML (the app's and the notebook's) and the notebook call ``atlas``.

    import attention_explorer as ae
    a = ae.atlas("bundled:SmolLM2-135M-Instruct", corpus="demo", out="atlas-smollm2", limit=100)
    a.card(3, 1)             # one head's card (a dict: summary, top contexts, profile, qk, ...)
    a.table()                # one row per head: kind, summary and its numbers (a pandas DataFrame)
    a.grid_figure()          # every head coloured by its summary's kind
    a.scatter("induction", "offset_-1")   # any two per-head numbers as axes
    a.context_html(3, 1)     # the top contexts with the query and the key marked

No streamlit here.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go

from model_core.atlas.keys import PROFILE_KEYS
from model_core.atlas.store import AtlasRun, open_atlas
from model_core.atlas.summary import KINDS

KIND_COLOURS = {"induction": "#d62728", "previous-token": "#1f77b4", "duplicate-token": "#9467bd", "self": "#8c564b",
                "sink": "#7f7f7f", "punctuation": "#bcbd22", "local": "#17becf", "broad": "#e7e7e7"}
NUMBERS = (*PROFILE_KEYS, "copying_score", "role_previous_token", "role_duplicate_token", "role_induction",
           "role_sink", "top_weight", "top_weight_no_sink")
"""The per-head numbers a scatter can plot (``head_numbers``)."""
NUMBER_TITLES = {"offset_0": "share at the query itself", "offset_-1": "share one token back (previous token)",
                 "offset_-2": "share two back", "offset_-3": "share three back", "offset_further": "share further",
                 "first_token": "share at the first token (sink)", "punctuation": "share at punctuation",
                 "entropy_bits": "mean entropy (bits)", "same_token": "share at another copy of the query token",
                 "induction": "induction share (after an earlier copy)", "copying_score": "OV copying score",
                 "role_previous_token": "Head roles: previous-token", "role_duplicate_token": "Head roles: duplicate",
                 "role_induction": "Head roles: induction", "role_sink": "Head roles: sink",
                 "top_weight": "best weight (every key)", "top_weight_no_sink": "best weight (no sink)"}


def head_numbers(card: dict[str, Any]) -> dict[str, float]:
    """A card's per-head numbers (``NUMBERS``), NaN where undefined."""
    nan = float("nan")
    out = {k: (nan if card["profile"].get(k) is None else float(card["profile"][k])) for k in PROFILE_KEYS}
    out["copying_score"] = nan if card["copying_score"] is None else float(card["copying_score"])
    for role in ("previous_token", "duplicate_token", "induction", "sink"):
        value = card["roles"].get(role)
        out[f"role_{role}"] = nan if value is None else float(value)
    for key, name in (("top_contexts", "top_weight"), ("top_contexts_no_sink", "top_weight_no_sink")):
        out[name] = card[key][0]["weight"] if card[key] else nan
    return out


def table_rows(heads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per head: layer, head, kind, summary and its numbers (for a DataFrame or the one CSV writer)."""
    return [{"layer": c["layer"], "head": c["head"], "kind": c["kind"], "summary": c["summary"], **head_numbers(c)}
            for c in heads]


def kind_grid_figure(heads: list[dict[str, Any]], n_layers: int, n_heads: int, *,
                     focus: tuple[int, int] | None = None) -> go.Figure:
    """A layer x head grid, each cell coloured by its head's kind; the hover shows the summary."""
    index = {k: i for i, k in enumerate(KINDS)}
    z = np.full((n_layers, n_heads), np.nan)
    text = np.full((n_layers, n_heads), "", dtype=object)
    for c in heads:
        z[c["layer"], c["head"]] = index[c["kind"]]
        text[c["layer"], c["head"]] = html.escape(c["summary"])
    n = len(KINDS)
    scale = [[v, KIND_COLOURS[k]] for i, k in enumerate(KINDS) for v in (i / n, (i + 1) / n)]
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(n_heads)), y=list(range(n_layers)), zmin=-0.5, zmax=n - 0.5, colorscale=scale,
        text=text, hovertemplate="L%{y}H%{x}: %{text}<extra></extra>", xgap=1, ygap=1,
        colorbar={"tickvals": list(range(n)), "ticktext": list(KINDS), "title": "kind"}))
    if focus is not None:
        fig.add_shape(type="rect", x0=focus[1] - 0.5, x1=focus[1] + 0.5, y0=focus[0] - 0.5, y1=focus[0] + 0.5,
                      line={"color": "black", "width": 2})
    fig.update_xaxes(title="head", dtick=1)
    fig.update_yaxes(title="layer", autorange="reversed", dtick=max(1, n_layers // 16))
    fig.update_layout(height=max(260, 18 * n_layers + 90), template="plotly_white",
                      margin={"l": 50, "r": 10, "t": 30, "b": 40}, title="Every head, coloured by its summary's kind")
    return fig


def scatter_figure(heads: list[dict[str, Any]], x: str, y: str, *, focus: tuple[int, int] | None = None) -> go.Figure:
    """Every head as a point with two per-head numbers (``NUMBERS``) as axes, coloured by kind; the hover names it."""
    if x not in NUMBERS or y not in NUMBERS:
        raise ValueError(f"The axes are per-head numbers: {', '.join(NUMBERS)}.")
    fig = go.Figure()
    for kind in KINDS:
        members = [c for c in heads if c["kind"] == kind]
        if not members:
            continue
        numbers = [head_numbers(c) for c in members]
        fig.add_trace(go.Scatter(
            x=[n[x] for n in numbers], y=[n[y] for n in numbers], mode="markers", name=kind,
            marker={"color": KIND_COLOURS[kind], "size": 9, "line": {"width": 0.5, "color": "#444"}},
            customdata=[[c["layer"], c["head"]] for c in members],
            text=[html.escape(c["summary"]) for c in members],
            hovertemplate="L%{customdata[0]}H%{customdata[1]}: %{text}<extra></extra>"))
    if focus is not None:
        card = next((c for c in heads if (c["layer"], c["head"]) == focus), None)
        if card is not None:
            n = head_numbers(card)
            fig.add_trace(go.Scatter(x=[n[x]], y=[n[y]], mode="markers", name="focused", hoverinfo="skip",
                                     marker={"size": 16, "symbol": "circle-open", "color": "black"}))
    fig.update_layout(height=420, template="plotly_white", margin={"l": 60, "r": 10, "t": 30, "b": 50},
                      xaxis_title=NUMBER_TITLES[x], yaxis_title=NUMBER_TITLES[y], clickmode="event+select")
    return fig


def profile_figure(card: dict[str, Any]) -> go.Figure:
    """The card's profile as bars: where the head's weight goes, on average."""
    keys = [k for k in PROFILE_KEYS if k != "entropy_bits"]
    values = [card["profile"][k] for k in keys]
    fig = go.Figure(go.Bar(x=[0.0 if v is None else v for v in values], y=[NUMBER_TITLES[k] for k in keys],
                           orientation="h", marker_color="#1f77b4",
                           text=["n/a" if v is None else f"{v:.2f}" for v in values], textposition="outside"))
    fig.update_xaxes(range=[0, 1.12], title="share of the weight (mean over query rows)")
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=320, template="plotly_white", margin={"l": 10, "r": 10, "t": 10, "b": 40})
    return fig


def _token_html(text: str) -> str:
    return html.escape(text).replace("\n", "⏎")


def context_html(context: dict[str, Any]) -> str:
    """One context's snippet as HTML: the key and the query marked (user text escaped), a gap shown as "…"."""
    parts, last = [], None
    for position, token in context["snippet"]:
        if last is not None and position != last + 1:
            parts.append('<span style="color:#999"> … </span>')
        style = ""
        if position == context["key"] and position == context["query"]:
            style = "background:#f4a582;outline:2px solid #b2182b"
        elif position == context["key"]:
            style = "background:#f4a582"
        elif position == context["query"]:
            style = "outline:2px solid #2166ac"
        title = "key" if position == context["key"] else "query" if position == context["query"] else ""
        body = _token_html(token)
        parts.append(f'<span style="{style}" title="{title} {position}">{body}</span>' if style else body)
        last = position
    return "".join(parts)


def contexts_html(contexts: list[dict[str, Any]]) -> str:
    """A list of contexts, one a line: weight, text id, the marked snippet."""
    rows = [f'<div style="font-family:monospace;white-space:pre-wrap;margin:2px 0">'
            f'<b>{c["weight"]:.3f}</b> <span style="color:#777">text {int(c["text_id"])}, '
            f'q{int(c["query"])}→k{int(c["key"])}</span> {context_html(c)}</div>' for c in contexts]
    legend = ('<div style="font-size:0.85em;color:#555">key: <span style="background:#f4a582">filled</span>, '
              'query: <span style="outline:2px solid #2166ac">outlined</span></div>')
    return legend + "".join(rows)


@dataclass
class Atlas:
    """An atlas folder opened in a notebook."""

    run: AtlasRun

    @property
    def heads(self) -> list[dict[str, Any]]:
        return self.run.heads

    def card(self, layer: int, head: int) -> dict[str, Any]:
        """One head's card (every key ``atlas --show --json`` prints, and its kind)."""
        return self.run.card(layer, head)

    def table(self) -> Any:
        """One row per head (a pandas DataFrame)."""
        import pandas as pd  # pandas is only needed for this table, not for the figures

        return pd.DataFrame(table_rows(self.heads))

    def grid_figure(self) -> go.Figure:
        return kind_grid_figure(self.heads, *self.run.shape)

    def scatter(self, x: str = "induction", y: str = "offset_-1") -> go.Figure:
        return scatter_figure(self.heads, x, y)

    def profile_figure(self, layer: int, head: int) -> go.Figure:
        return profile_figure(self.card(layer, head))

    def context_html(self, layer: int, head: int, no_sink: bool = True) -> str:
        card = self.card(layer, head)
        return contexts_html(card["top_contexts_no_sink" if no_sink else "top_contexts"])


def atlas(model: str | None = None, corpus: Any = "demo", out: str | Path | None = None, *, limit: int | None = None,
          qk_contexts: int = 3, qk_pick: str = "auto", max_tokens: int = 512, device: str | None = None,
          engine: str = "local", progress: Any = None) -> Atlas:
    """Run (or open, or continue) an atlas of ``model`` over ``corpus`` and open it.

    Args:
        model: a pretrained model id (default: the deployment's default model).
        corpus: "demo", a file path, "hf:DATASET", or a ``model_core.corpus.Corpus``.
        out: the atlas folder (default: a folder under the system's temporary directory named by model and corpus).
            An existing atlas of the same model and texts is opened or continued, not run again.
        qk_contexts, qk_pick: how many of each head's top contexts the QK split and the direct logit effect read,
            and which (``model_core.atlas.picks``: "auto", "first" or "shared").
    """
    from model_core.atlas import AtlasOptions, run_atlas  # noqa: PLC0415 (torch loads only when an atlas runs)
    from model_core.corpus import Corpus, CorpusModel, demo_corpus, read_hub_dataset, read_path  # noqa: PLC0415

    if isinstance(corpus, Corpus):
        texts = corpus
    elif corpus == "demo":
        texts = demo_corpus(limit=limit)
    elif str(corpus).startswith("hf:"):
        texts = read_hub_dataset(str(corpus)[3:], limit=limit)
    else:
        texts = read_path(corpus, limit=limit)
    spec = CorpusModel.from_options("pretrained", model)
    if out is None:
        import tempfile  # noqa: PLC0415 (only a default folder needs it)

        name = (spec.model_id or "model").replace("/", "_").replace(":", "_")
        out = Path(tempfile.gettempdir()) / f"atlas-{name}-{texts.fingerprint[:12]}"
    options = AtlasOptions(qk_contexts=qk_contexts, qk_pick=qk_pick, max_tokens=max_tokens)  # type: ignore[arg-type]
    run = run_atlas(texts, spec, out, options=options, device=device, engine=engine,
                    progress=progress)  # type: ignore[arg-type]
    return Atlas(run)


def open_folder(path: str | Path) -> Atlas:
    """Open an atlas folder written before (by ``atlas``, the CLI or the app)."""
    return Atlas(open_atlas(path))
