"""Direct logit attribution in a notebook and its figures (the page draws the same ones; no streamlit here).

    from attention_explorer.attribution import attribute
    dla = attribute(t.core, "bundled:SmolLM2-135M-Instruct", answer=" Paris", foil=" London")  # foil: runner-up
    dla.attribution.heads       # (layer, head) direct effects
    dla.heads_figure            # the L x H grid
    dla.sources_figure(23, 4)   # one head's effect over its source tokens
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go

from attention_explorer.figures import (
    SCORE_SCALE,
    category_ticks,
    layer_head_figure,
    token_labels,
)
from model_core.effects.attribution import Attribution, token_id_of, top_two
from model_core.effects.attribution import attribute as attribute_core

POSITIVE_RGB = (178, 24, 43)  # RdBu_r's red end: towards the answer
NEGATIVE_RGB = (33, 102, 172)  # its blue end: against it


def _symmetric(values: np.ndarray) -> float:
    """The colour range ±m of a diverging scale centred at 0 (never 0 itself)."""
    m = float(np.nanmax(np.abs(values))) if np.size(values) else 0.0
    return m if m > 0 else 1.0


def what_is_split(attribution: Attribution, decode: Any) -> str:
    """"logit(' Paris')" or "logit(' Paris') − logit(' London')", the token text from ``decode(id)``."""
    text = f"logit({decode(attribution.answer_id)!r})"
    return text if attribution.foil_id is None else f"{text} − logit({decode(attribution.foil_id)!r})"


def heads_figure(attribution: Attribution, *, title: str = "", clickable: bool = False) -> go.Figure:
    """The L x H grid of head effects on a diverging scale centred at 0 (red: towards the answer)."""
    m = _symmetric(attribution.heads)
    return layer_head_figure(attribution.heads, title or "Each head's direct effect", colorscale=SCORE_SCALE,
                             zmin=-m, zmax=m, colorbar="effect", clickable=clickable)


def parts_figure(attribution: Attribution, *, title: str = "") -> go.Figure:
    """The embedding, every MLP, all heads together and the rest as bars, then the parts' sum beside the logit."""
    names = ["embed", *(f"MLP {i}" for i in range(attribution.n_layers)), "all heads", "rest"]
    values = [attribution.embed, *attribution.mlps, float(attribution.heads.sum()), attribution.rest]
    colours = ["#b2182b" if v >= 0 else "#2166ac" for v in values]
    fig = go.Figure(go.Bar(x=names, y=values, marker_color=colours,
                           hovertemplate="%{x}<br>%{y:.4f}<extra></extra>"))
    fig.add_hline(y=0, line_color="#555", line_width=1)
    fig.update_xaxes(type="category", tickfont={"size": 10})
    fig.update_yaxes(title="direct effect")
    fig.update_layout(title=title or f"Embedding, MLPs and the rest (they sum to {attribution.total:.3f} with the "
                                     "heads)", height=380, margin={"l": 60, "r": 20, "t": 50, "b": 60},
                      template="plotly_white", showlegend=False)
    return fig


def sources_bars(split: np.ndarray, tokens: tuple[str, ...] | list[str], *, title: str) -> go.Figure:
    """One head's effect over its source tokens as bars (a long text's view of ``sources_html``).

    Shape: split (k_pos,).
    """
    labels = token_labels(list(tokens))
    colours = ["#b2182b" if v >= 0 else "#2166ac" for v in split]
    fig = go.Figure(go.Bar(x=labels, y=split, marker_color=colours,
                           hovertemplate="%{x}<br>%{y:.4f}<extra></extra>"))
    fig.update_xaxes(**category_ticks(labels))
    fig.update_yaxes(title="effect from this token")
    fig.update_layout(title=title, height=320, margin={"l": 60, "r": 20, "t": 50, "b": 60}, template="plotly_white",
                      showlegend=False)
    return fig


def sources_html(split: np.ndarray, tokens: tuple[str, ...] | list[str], *, position: int | None = None) -> str:
    """The text with each token shaded by its signed share of a head's effect (red towards the answer, blue
    against), escaped; the read position is outlined. Shape: split (k_pos,)."""
    m = _symmetric(split)
    spans = []
    for i, (token, value) in enumerate(zip(tokens, split)):
        rgb = POSITIVE_RGB if value >= 0 else NEGATIVE_RGB
        alpha = min(1.0, abs(float(value)) / m)
        outline = "outline:2px solid #333;" if i == position else ""
        ink = "color:#fff;" if alpha > 0.55 else ""  # dark shades keep their text legible
        shown = html.escape(token).replace("\n", "↵")
        spans.append(f'<span title="{i}: {float(value):+.4f}" style="background:rgba({rgb[0]},{rgb[1]},{rgb[2]},'
                     f'{alpha:.3f});{ink}{outline}white-space:pre-wrap;padding:1px 0;">{shown}</span>')
    return '<div style="line-height:1.9;font-family:monospace;font-size:0.9rem;">' + "".join(spans) + "</div>"


@dataclass(frozen=True, eq=False)
class DLA:
    """A notebook's direct logit attribution: the numbers and their figures.

    Attributes:
        attribution: the ``model_core.effects.attribution.Attribution`` (heads, mlps, embed, rest, logit...).
        trace: the trace it splits (``AttentionTrace``).
        text: the tokens as text (" flies", not "Ġflies").
        label: what is split, e.g. "logit(' Paris') − logit(' London')".
    """

    attribution: Attribution
    trace: Any
    text: tuple[str, ...]
    label: str

    @property
    def heads_figure(self) -> go.Figure:
        return heads_figure(self.attribution, title=f"Each head's direct effect on {self.label}")

    @property
    def parts_figure(self) -> go.Figure:
        return parts_figure(self.attribution)

    def sources(self, layer: int, head: int) -> np.ndarray:
        """One head's effect over its source tokens. Shape: (k_pos,)."""
        return self.attribution.sources(self.trace, layer, head)

    def sources_figure(self, layer: int | None = None, head: int | None = None) -> go.Figure:
        """One head's (default: the strongest's) effect over its source tokens, as bars."""
        if layer is None or head is None:
            layer, head = np.unravel_index(int(np.abs(self.attribution.heads).argmax()), self.attribution.heads.shape)
        return sources_bars(self.sources(int(layer), int(head)), self.text,
                            title=f"Layer {layer}, head {head}: its effect on {self.label}, by source token")

    def _repr_html_(self) -> str:
        a = self.attribution
        return (f"<p>{html.escape(self.label)} at token {a.position}: {a.logit:.4f}; the parts sum to {a.total:.4f} "
                f"(embed {a.embed:.3f}, heads {a.heads.sum():.3f}, MLPs {a.mlps.sum():.3f}, rest {a.rest:.3f}).</p>")


def _token(tokenizer: Any, value: str | int | None, default: int | None) -> int | None:
    if value is None:
        return default
    return int(value) if isinstance(value, (int, np.integer)) else token_id_of(tokenizer, value)


def attribute(core: Any, model: Any, family: Any = None, answer: str | int | None = None,
              foil: str | int | bool | None = None, *, position: int = -1, no_foil: bool = False,
              device: str | None = None, runner_up: bool | None = None) -> DLA:
    """Direct logit attribution of a decoder's trace, with figures.

    Args:
        core: the trace (``Trace.core``, an ``AttentionTrace``).
        model: the model it came from: a model id ("bundled:SmolLM2-135M-Instruct", loaded once and kept), or a
            ``LoadedModel`` (``model_core.load_pretrained``).
        family: its adapter; default: the trace's.
        answer: the answer token as written (" Paris") or its id; default: the top prediction.
        foil: a token (" London") or id whose logit is subtracted; default (None): the runner-up (the top
            prediction when the answer is the runner-up), as on the page and the command line; False: no foil.
        position: the position whose next-token logit is split; negative counts from the end.
        no_foil: True splits the answer's logit itself (as ``foil=False``).
        runner_up: ignored; older callers passed it when the runner-up was not the default.

    Raises:
        NotADecoder: the trace is an encoder's. NotOneToken: an answer or foil is several tokens (its pieces are
        listed). ValueError: ``foil`` and ``no_foil`` together. RuntimeError: the parts do not sum to the model's logit.
    """
    from model_core.models.loading import load_pretrained

    del runner_up  # the runner-up is the default now
    if foil is True:
        raise ValueError("foil=True names no token: leave foil out for the runner-up, or give a token or its id.")
    if no_foil and foil not in (None, False):
        raise ValueError(f"no_foil=True and foil={foil!r} ask for opposite things: give one of them.")
    loaded = load_pretrained(model, device=device) if isinstance(model, str) else model
    family = family or getattr(loaded, "family", None) or core.family
    tokenizer = loaded.tokenizer
    top, second = top_two(core, position) if core.next_token_ids is not None else (None, None)
    answer_id = _token(tokenizer, answer, top)
    if no_foil or foil is False:
        foil_id = None
    elif foil is None:
        if second is None:
            raise ValueError("This trace keeps no next-token predictions, so there is no runner-up: give the foil "
                             "as a token, or foil=False for none.")
        foil_id = second if second != answer_id else top
    else:
        foil_id = _token(tokenizer, foil, None)
    result = attribute_core(core, loaded.model, family, answer_id, foil_id, position)
    decode = lambda i: tokenizer.decode([int(i)])
    return DLA(attribution=result, trace=core, text=tuple(decode(i) for i in core.token_ids),
               label=what_is_split(result, decode))
