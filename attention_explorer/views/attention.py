"""bertviz's head and model views of an AttentionTrace: one pipeline, two layouts.

Only the shown layers (and heads) are sent, as integers in thousandths; layers not shown are zeros
that take no memory. The page gets an explicit height from bertviz's own layout constants.
No streamlit here; bertviz (which imports IPython) is imported inside the functions.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from attention_explorer.views.assets import DEFAULT_ASSET_BASE
from attention_explorer.views.page import (
    CONTROLS_PX,
    BertvizView,
    compact_pairs,
    find_params,
    finish,
    pack_weights,
    quantize,
    shown,
)
from attention_explorer.views.size import check_indices, count_elements
from model_core.trace.trace import AttentionTrace

# bertviz layout constants (head_view.js, model_view.js), for the page height.
_HEAD_BOX_HEIGHT, _HEAD_TEXT_TOP = 22.5, 30
_MODEL_AXIS, _MODEL_THUMB_PAD, _MODEL_DETAIL_BOX, _MODEL_DETAIL_EXTRA = 38, 5, 18, 2 * 15 + 25


def bertviz_inputs(
    trace: AttentionTrace,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    token_window: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The arguments of bertviz's ``head_view``/``model_view`` for this trace.

    ``attention`` follows bertviz's contract (one tensor per layer, batch of one) but holds
    integers in 1/SCALE. Layers outside ``include_layers`` are zeros that take no memory
    (a broadcast view): bertviz reads their shape (the model view counts heads in layer 0)
    but never their values.

    Shape: attention[layer] is (1, head, q_pos, k_pos) int32.
    """
    import torch

    window = shown(trace, token_window)
    layers = check_indices("layer", layers, trace.n_layers)
    heads = check_indices("head", heads, trace.n_heads)
    n = len(window.tokens)
    unsent = torch.zeros((1, 1, 1, 1), dtype=torch.int32).expand(1, trace.n_heads, n, n)
    attention: list[Any] = [unsent] * trace.n_layers
    for layer in layers:
        attention[layer] = torch.from_numpy(quantize(window.weights[layer]))[None]  # (1, head, q_pos, k_pos)
    return {
        "attention": attention,
        "tokens": window.tokens,
        "sentence_b_start": window.sentence_b_start,
        "include_layers": layers,
        "heads": heads,
    }


def _bertviz_page(kind: str, tokens: list[str], sentence_b_start: int | None) -> str:
    """bertviz's page for one layer and one head of zeros: its template and its parameters' structure (pair
    blocks, cleaned-up tokens), built in moments; the real weights and layers go in afterwards."""
    import torch
    from bertviz import head_view, model_view

    n = len(tokens)
    zeros = [torch.zeros((1, 1, 1, 1), dtype=torch.int32).expand(1, 1, n, n)]  # (1, head, q_pos, k_pos)
    common = {"attention": zeros, "tokens": tokens, "sentence_b_start": sentence_b_start, "include_layers": [0],
              "html_action": "return"}
    if kind == "head":
        return head_view(layer=0, **common).data
    return model_view(include_heads=[0], display_mode="light", **common).data


def _height(kind: str, n: int, n_layers: int, total_heads: int) -> int:
    if kind == "head":
        return math.ceil(n * _HEAD_BOX_HEIGHT + _HEAD_TEXT_TOP) + CONTROLS_PX
    box = 7 * (12 / total_heads)  # model_view.js: thumbnailBoxHeight = 7 * (12 / totalHeads)
    thumbnails = n_layers * (n * box + 2 * _MODEL_THUMB_PAD) + _MODEL_AXIS
    detail = n * _MODEL_DETAIL_BOX + _MODEL_DETAIL_EXTRA
    return math.ceil(max(thumbnails, detail)) + CONTROLS_PX


def attention_view_html(kind: str, trace: AttentionTrace, layers: list[int] | None = None,
                        heads: list[int] | None = None, token_window: tuple[int, int] | None = None,
                        asset_base: str | None = DEFAULT_ASSET_BASE) -> BertvizView:
    """bertviz's head view (``kind="head"``) or model view (``kind="model"``) of the trace.

    Args:
        kind: "head": lines between tokens, one layer at a time, a colour per head; "model": a
            thumbnail per (layer, head), a click enlarges one.
        trace: the forward pass to show.
        layers: layers sent (default: all): the head view's layer menu, the model view's rows.
        heads: heads sent (default: all), in this order: the head view's colour squares, the model view's columns.
        token_window: (start, stop) positions to show, half-open; None for the whole input.
        asset_base: where the page loads require.js, d3 and jQuery from; None inlines them (offline, self-contained).

    Raises:
        ValueError: an unknown kind, or layers, heads or window out of range.
    """
    if kind not in ("head", "model"):
        raise ValueError(f"kind {kind!r} is not 'head' or 'model' (the neuron view is neuron_view_html).")
    args = bertviz_inputs(trace, layers, heads, token_window)
    html = _bertviz_page(kind, args["tokens"], args["sentence_b_start"])
    start, end, params = find_params(html, "const params = ")
    sent = np.stack([args["attention"][layer][0, args["heads"]].numpy() for layer in args["include_layers"]])
    params["attention"][0]["attn"] = pack_weights(sent)  # (layer, head, q_pos, k_pos), shown ones only
    params["include_layers"] = args["include_layers"]
    if kind == "head":  # bertviz's head view has no include_heads: it gets only the chosen heads
        params["layer"] = args["include_layers"][0]
    else:
        params["include_heads"], params["total_heads"] = args["heads"], trace.n_heads
    compact_pairs(params["attention"])
    n, n_layers, n_heads = len(args["tokens"]), len(args["include_layers"]), len(args["heads"])
    return BertvizView(
        kind=kind,
        html=finish(html, kind, params, (start, end), asset_base),
        height=_height(kind, n, n_layers, trace.n_heads),
        n_tokens=n,
        n_elements=count_elements(kind, n, 1 if kind == "head" else n_layers, n_heads, trace.d_head),
    )


def head_view_html(trace: AttentionTrace, layers: list[int] | None = None, heads: list[int] | None = None,
                   token_window: tuple[int, int] | None = None,
                   asset_base: str | None = DEFAULT_ASSET_BASE) -> BertvizView:
    """bertviz's head view: the weights of one layer at a time as lines between tokens (``attention_view_html``)."""
    return attention_view_html("head", trace, layers, heads, token_window, asset_base)


def model_view_html(trace: AttentionTrace, layers: list[int] | None = None, heads: list[int] | None = None,
                    token_window: tuple[int, int] | None = None,
                    asset_base: str | None = DEFAULT_ASSET_BASE) -> BertvizView:
    """bertviz's model view: a thumbnail per (layer, head); a click enlarges one (``attention_view_html``)."""
    return attention_view_html("model", trace, layers, heads, token_window, asset_base)
