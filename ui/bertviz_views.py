"""bertviz's head, model and neuron views of an AttentionTrace: offline, compact, sized to fit.

bertviz builds each view as one HTML page whose script loads require.js, d3 and jQuery from a
public CDN and embeds the weights as full-precision JSON, twice for sentence pairs. This module
keeps bertviz's own Python and JavaScript and adapts what goes in and what comes out:

* in: the weights of the shown layers (and, for the model view, heads) only, as integers in
  thousandths, so that bertviz's JSON carries ``12`` instead of ``0.012345678901234``;
* out: the CDN addresses point at the files that ``scripts/install_assets.sh`` puts in
  ``static/vendor/`` (Streamlit serves them at ``app/static/vendor/``); the sentence-pair blocks
  (A->A, A->B, B->A, B->B) become index ranges into the full matrix, which a small script
  (``aeExpand``) turns back into bertviz's structure in the browser, with the thousandths divided
  back out; the page gets an explicit height computed from bertviz's own layout constants.

The neuron view's Python half only runs bertviz's forked BERT classes, so its numbers come from
the trace (queries, keys and weights, for the custom encoder and BERT alike): bertviz builds its
page around a one-token stand-in, and the stand-in's parameters are swapped for the trace's.

No streamlit here; bertviz (which imports IPython) is imported inside the functions.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model_core.trace import AttentionTrace
from ui.bertviz_size import VIEW_KINDS, check_indices, check_window, count_elements

SCALE = 1000
"""Weights, queries and keys travel as integers in 1/SCALE: rounding error at most 5e-4."""

DEFAULT_ASSET_BASE = "app/static/vendor"
"""Where the page finds require.js, d3 and jQuery. Relative, so that a srcdoc iframe resolves it
against the app's own address (and any ``server.baseUrlPath``)."""

VENDOR_FILES = ("require.js", "d3v3.min.js", "d3v5.min.js", "jquery.min.js")
"""Files ``scripts/install_assets.sh`` puts in static/vendor/."""

# d3 per view: the head view draws with d3 3.x (bertviz's head_view.js falls back to
# d3.scale.category10), the model and neuron views need d3 >= 4 (d3.schemeCategory10, d3.line).
_D3_FOR_VIEW = {"head": "d3v3.min", "model": "d3v5.min", "neuron": "d3v5.min"}

_CDN = re.compile(r"https://cdnjs\.cloudflare\.com/ajax/libs/(require\.js|d3|jquery)/[^'\"]+?\.min(\.js)?(?=['\"])")

_QUOTED_URL = re.compile(r"""["'](https?:)?//""")

# bertviz layout constants (head_view.js, model_view.js, neuron_view.js), for the page height.
_HEAD_BOX_HEIGHT, _HEAD_TEXT_TOP = 22.5, 30
_MODEL_AXIS, _MODEL_THUMB_PAD, _MODEL_DETAIL_BOX, _MODEL_DETAIL_EXTRA = 38, 5, 18, 2 * 15 + 25
_NEURON_BOX_HEIGHT, _NEURON_PADDING = 26, 100
_CONTROLS = 48  # the select row above each view, the root div's padding and a safety margin


@dataclass(frozen=True)
class BertvizView:
    """One bertviz view, ready for ``st.iframe(view.html, height=view.height)``.

    Attributes:
        kind: "head", "model" or "neuron".
        html: a self-contained page; it loads scripts only from ``asset_base``.
        height: CSS pixels that show the whole view without a vertical scroll bar.
        n_tokens: tokens shown (after any token window).
        n_elements: SVG elements the browser will draw, the measure of its drawing time.
    """

    kind: str
    html: str
    height: int
    n_tokens: int
    n_elements: int

    def __post_init__(self) -> None:
        if self.kind not in VIEW_KINDS:
            raise ValueError(f"kind {self.kind!r} is not one of {', '.join(VIEW_KINDS)}.")
        if self.height <= 0:
            raise ValueError(f"height must be positive, got {self.height}.")


# -- selecting what is shown ---------------------------------------------------------------------
@dataclass(frozen=True)
class _Shown:
    """The part of a trace a view shows: a token window, with positions renumbered from 0."""

    tokens: list[str]
    attentions: np.ndarray  # (layer, head, q_pos, k_pos), all layers and heads of the window
    queries: np.ndarray  # (layer, head, pos, d_head)
    keys: np.ndarray  # (layer, head, pos, d_head)
    sentence_b_start: int | None
    causal: bool


def _shown(trace: AttentionTrace, token_window: tuple[int, int] | None) -> _Shown:
    start, stop = check_window(trace, token_window)
    b = trace.sentence_b_start
    # A window that holds only one of the two sentences is shown as one sentence.
    b_start = b - start if b is not None and start < b < stop else None
    return _Shown(
        tokens=list(trace.tokens[start:stop]),
        attentions=trace.attentions[:, :, start:stop, start:stop],
        queries=trace.queries[:, :, start:stop],
        keys=trace.keys[:, :, start:stop],
        sentence_b_start=b_start,
        causal=trace.causal,
    )


def quantize(x: np.ndarray) -> np.ndarray:
    """Round to the nearest 1/SCALE and return the integers (error at most 0.5/SCALE).

    Shape: same as ``x``, int32.
    """
    return np.rint(np.asarray(x, dtype=np.float64) * SCALE).astype(np.int32)


# -- adapting bertviz's output -------------------------------------------------------------------
# Inlined into each view's srcdoc page (a srcdoc iframe loads nothing it is not given).
_EXPAND_JS = f"<script>\n{(Path(__file__).parent / 'js' / 'bertviz_expand.js').read_text()}</script>\n"

_PAGE_STYLE = "<style>html, body { margin: 0; padding: 0; background: white; }</style>\n"


def _safe_json(obj: Any) -> str:
    # A token such as "</script>" must not end the script that carries it.
    return json.dumps(obj, separators=(",", ":")).replace("</", "<\\/")


def _find_params(html: str, marker: str) -> tuple[int, int, Any]:
    """Locate the JSON literal bertviz put after ``marker``: (start, end, decoded value)."""
    at = html.index(marker) + len(marker)
    value, end = json.JSONDecoder().raw_decode(html, at)
    return at, end, value


def _localize(html: str, kind: str, asset_base: str) -> str:
    """Point bertviz's CDN addresses at the local copies."""
    base = asset_base.rstrip("/")

    def local(match: re.Match[str]) -> str:
        lib = match.group(1)
        if lib == "require.js":
            return f"{base}/require.js"
        if lib == "d3":
            return f"{base}/{_D3_FOR_VIEW[kind]}"
        return f"{base}/jquery.min"

    out = _CDN.sub(local, html)
    # Only quoted addresses load anything (the scripts' header comments name their sources).
    if _QUOTED_URL.search(out):
        raise RuntimeError(
            "bertviz's page still names an outside address after localizing; the installed bertviz "
            "differs from 1.4.1. Check ui/bertviz_views._CDN against bertviz's *_view.js files."
        )
    return out


def _compact_pairs(attention: list[dict[str, Any]]) -> None:
    """Replace bertviz's sentence-pair copies (entries 1-4) by ranges into entry 0, in place."""
    names = {
        "Sentence A -> Sentence A": "aa",
        "Sentence B -> Sentence B": "bb",
        "Sentence A -> Sentence B": "ab",
        "Sentence B -> Sentence A": "ba",
    }
    n = len(attention[0]["left_text"])
    n_a = len(attention[1]["left_text"]) if len(attention) > 1 else n
    spans = {"a": (0, n_a), "b": (n_a, n)}
    for entry in attention[1:]:
        rows, cols = names[entry["name"]]
        entry["attn"] = {"ae_block": [*spans[rows], *spans[cols]]}


def _finish(html: str, kind: str, marker: str, params: dict[str, Any], span: tuple[int, int], asset_base: str) -> str:
    start, end = span
    html = html[:start] + f"aeExpand({_safe_json(params)}, {SCALE})" + html[end:]
    return _PAGE_STYLE + _EXPAND_JS + _localize(html, kind, asset_base)


# -- the three views -----------------------------------------------------------------------------
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

    shown = _shown(trace, token_window)
    layers = check_indices("layer", layers, trace.n_layers)
    heads = check_indices("head", heads, trace.n_heads)
    n = len(shown.tokens)
    unsent = torch.zeros((1, 1, 1, 1), dtype=torch.int32).expand(1, trace.n_heads, n, n)
    attention: list[Any] = [unsent] * trace.n_layers
    for layer in layers:
        attention[layer] = torch.from_numpy(quantize(shown.attentions[layer]))[None]  # (1, head, q_pos, k_pos)
    return {
        "attention": attention,
        "tokens": shown.tokens,
        "sentence_b_start": shown.sentence_b_start,
        "include_layers": layers,
        "heads": heads,
    }


def head_view_html(
    trace: AttentionTrace,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    token_window: tuple[int, int] | None = None,
    asset_base: str = DEFAULT_ASSET_BASE,
) -> BertvizView:
    """bertviz's head view: the weights of one layer at a time as lines between tokens.

    Args:
        trace: the forward pass to show.
        layers: layers the view's own layer menu offers (default: all); only these are sent.
        heads: heads sent (default: all), in this order: the view's colour squares stand for them.
        token_window: (start, stop) positions to show, half-open; None for the whole input.
        asset_base: where the page loads require.js, d3 and jQuery from.

    Raises:
        ValueError: layers, heads or window out of range.
    """
    from bertviz import head_view

    args = bertviz_inputs(trace, layers, heads, token_window)
    # bertviz's head view has no include_heads: send it only the chosen heads' rows.
    sent_heads, shown_layers = args["heads"], set(args["include_layers"])
    n = len(args["tokens"])
    unsent = args["attention"][0].new_zeros((1, 1, 1, 1)).expand(1, len(sent_heads), n, n)
    attention = [a[:, sent_heads] if layer in shown_layers else unsent  # (1, head, q_pos, k_pos)
                 for layer, a in enumerate(args["attention"])]
    html = head_view(
        attention=attention,
        tokens=args["tokens"],
        sentence_b_start=args["sentence_b_start"],
        include_layers=args["include_layers"],
        layer=args["include_layers"][0],
        html_action="return",
    ).data
    start, end, params = _find_params(html, "const params = ")
    _compact_pairs(params["attention"])
    height = math.ceil(n * _HEAD_BOX_HEIGHT + _HEAD_TEXT_TOP) + _CONTROLS
    return BertvizView(
        kind="head",
        html=_finish(html, "head", "const params = ", params, (start, end), asset_base),
        height=height,
        n_tokens=n,
        n_elements=count_elements("head", n, 1, len(sent_heads), trace.d_head),
    )


def model_view_html(
    trace: AttentionTrace,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    token_window: tuple[int, int] | None = None,
    asset_base: str = DEFAULT_ASSET_BASE,
) -> BertvizView:
    """bertviz's model view: a thumbnail per (layer, head); a click enlarges one.

    Args:
        trace: the forward pass to show.
        layers: rows of thumbnails (default: all layers); only these are sent.
        heads: columns of thumbnails (default: all heads); only these are sent.
        token_window: (start, stop) positions to show, half-open; None for the whole input.
        asset_base: where the page loads require.js, d3 and jQuery from.

    Raises:
        ValueError: layers, heads or window out of range.
    """
    from bertviz import model_view

    args = bertviz_inputs(trace, layers, heads, token_window)
    html = model_view(
        attention=args["attention"],
        tokens=args["tokens"],
        sentence_b_start=args["sentence_b_start"],
        include_layers=args["include_layers"],
        include_heads=args["heads"],
        display_mode="light",
        html_action="return",
    ).data
    start, end, params = _find_params(html, "const params = ")
    _compact_pairs(params["attention"])
    n = len(args["tokens"])
    n_layers = len(args["include_layers"])
    box = 7 * (12 / trace.n_heads)  # model_view.js: thumbnailBoxHeight = 7 * (12 / totalHeads)
    thumbnails = n_layers * (n * box + 2 * _MODEL_THUMB_PAD) + _MODEL_AXIS
    detail = n * _MODEL_DETAIL_BOX + _MODEL_DETAIL_EXTRA
    return BertvizView(
        kind="model",
        html=_finish(html, "model", "const params = ", params, (start, end), asset_base),
        height=math.ceil(max(thumbnails, detail)) + _CONTROLS,
        n_tokens=n,
        n_elements=count_elements("model", n, n_layers, len(args["heads"]), trace.d_head),
    )


class _StandInTokenizer:
    """Enough of a tokenizer for bertviz's neuron_view.get_attention on a one-word stand-in."""

    cls_token = "[CLS]"
    sep_token = "[SEP]"

    def tokenize(self, text: str) -> list[str]:
        return [text]

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]:
        return list(range(len(tokens)))


class _StandInModel:
    """Replays a tiny attention so that bertviz's neuron view builds its page skeleton."""

    def eval(self) -> None:
        return None

    def __call__(self, input_ids: Any, token_type_ids: Any = None) -> tuple[Any, list[dict[str, Any]]]:
        import torch

        n = int(input_ids.shape[1])
        attn = torch.full((1, 1, n, n), 1.0 / n)
        vectors = torch.zeros((1, 1, n, 1))
        return None, [{"attn": attn, "queries": vectors, "keys": vectors}]


def neuron_params(
    trace: AttentionTrace, layer: int, token_window: tuple[int, int] | None = None
) -> dict[str, dict[str, Any]]:
    """The ``attention`` structure bertviz's neuron view reads, built from the trace.

    Same keys as bertviz's ``neuron_view.get_attention`` ("all", and for pairs "aa", "ab", "ba",
    "bb"), for one layer and all its heads; numbers are integers in 1/SCALE and the pair blocks
    are ``{"ae_block": [row0, row1, col0, col1]}`` ranges into "all" (see ``aeExpand``).

    Shape: all.attn is (1, head, q_pos, k_pos); all.queries and all.keys are (1, head, pos, d_head).
    """
    shown = _shown(trace, token_window)
    layer = check_indices("layer", [layer], trace.n_layers)[0]
    from bertviz.neuron_view import format_special_chars  # bertviz's own token clean-up

    tokens = format_special_chars(shown.tokens)
    params: dict[str, dict[str, Any]] = {
        "all": {
            "attn": [quantize(shown.attentions[layer]).tolist()],
            "queries": [quantize(shown.queries[layer]).tolist()],
            "keys": [quantize(shown.keys[layer]).tolist()],
            "left_text": tokens,
            "right_text": tokens,
        }
    }
    b = shown.sentence_b_start
    if b is not None:
        n = len(tokens)
        spans = {"a": (0, b), "b": (b, n)}
        for rows, cols in ("aa", "bb", "ab", "ba"):
            (r0, r1), (c0, c1) = spans[rows], spans[cols]
            params[rows + cols] = {
                "attn": {"ae_block": [r0, r1, c0, c1]},
                "left_text": tokens[r0:r1],
                "right_text": tokens[c0:c1],
            }
    return params


def neuron_view_html(
    trace: AttentionTrace,
    layer: int = 0,
    head: int = 0,
    token_window: tuple[int, int] | None = None,
    asset_base: str = DEFAULT_ASSET_BASE,
) -> BertvizView:
    """bertviz's neuron view: how one query and the keys make the weights, for either model.

    The queries and keys come from the trace, so the custom encoder gets a neuron view too.
    One layer is sent (its number is shown in place of bertviz's layer menu); the head menu
    offers all its heads.

    Args:
        trace: the forward pass to show.
        layer: the layer shown.
        head: the head shown first.
        token_window: (start, stop) positions to show, half-open; None for the whole input.
        asset_base: where the page loads require.js, d3 and jQuery from.

    Raises:
        ValueError: layer, head or window out of range.
    """
    from bertviz.neuron_view import show

    check_indices("head", [head], trace.n_heads)
    params_attention = neuron_params(trace, layer, token_window)
    pair = "aa" in params_attention
    html = show(
        _StandInModel(),
        "bert",
        _StandInTokenizer(),
        "a",
        "b" if pair else None,
        display_mode="light",
        layer=0,
        head=head,
        html_action="return",
    ).data
    marker = "window.bertviz_params = "
    start, end, params = _find_params(html, marker)
    params["attention"] = params_attention
    params["bidirectional"] = not trace.causal
    # bertviz's layer menu would list the one layer sent as "0": show its real number instead.
    html = html.replace(
        '<span class="dropdown-label">Layer: </span><select id="layer"></select>',
        f'<span class="dropdown-label">Layer: {int(layer)} </span><select id="layer" style="display:none"></select>',
    )
    start, end, _ = _find_params(html, marker)
    n = len(params_attention["all"]["left_text"])
    return BertvizView(
        kind="neuron",
        html=_finish(html, "neuron", marker, params, (start, end), asset_base),
        height=math.ceil(n * _NEURON_BOX_HEIGHT + _NEURON_PADDING) + _CONTROLS,
        n_tokens=n,
        n_elements=count_elements("neuron", n, 1, 1, trace.d_head),
    )


def view_html(
    kind: str,
    trace: AttentionTrace,
    layers: list[int] | None = None,
    heads: list[int] | None = None,
    token_window: tuple[int, int] | None = None,
    asset_base: str = DEFAULT_ASSET_BASE,
) -> BertvizView:
    """One of the three views by name; for "neuron" the first of ``layers`` and ``heads`` is shown."""
    if kind == "head":
        return head_view_html(trace, layers, heads, token_window, asset_base)
    if kind == "model":
        return model_view_html(trace, layers, heads, token_window, asset_base)
    if kind == "neuron":
        return neuron_view_html(trace, (layers or [0])[0], (heads or [0])[0], token_window, asset_base)
    raise ValueError(f"kind {kind!r} is not one of {', '.join(VIEW_KINDS)}.")


def vendor_missing(static_dir: str) -> list[str]:
    """The files of ``VENDOR_FILES`` missing from ``static_dir``/vendor (empty when installed)."""
    from pathlib import Path

    vendor = Path(static_dir) / "vendor"
    return [name for name in VENDOR_FILES if not (vendor / name).is_file()]
