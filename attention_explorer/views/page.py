"""The pipeline every bertviz view shares: the shown window, compact numbers, and bertviz's page made offline.

bertviz builds each view as one HTML page whose script loads require.js, d3 and jQuery from a
public CDN and embeds the weights as full-precision JSON, twice for sentence pairs. Here:

* in: numbers travel as integers in thousandths (``quantize``), so that bertviz's JSON carries ``12``
  instead of ``0.012345678901234``; the head and model views' weights as base64 uint16 (``pack_weights``);
* out: the sentence-pair blocks (A->A, A->B, B->A, B->B) become index ranges into the full matrix,
  which a small script (``aeExpand``, js/bertviz_expand.js) turns back into bertviz's structure in
  the browser, with the thousandths divided back out; the scripts are served or inlined (``assets``).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attention_explorer.views.assets import inline_scripts, serve_scripts
from attention_explorer.views.size import VIEW_KINDS, check_window
from model_core.trace.trace import AttentionTrace

SCALE = 1000
"""Weights, queries and keys travel as integers in 1/SCALE: rounding error at most 5e-4."""

CONTROLS_PX = 48
"""The select row above each view, the root div's padding and a safety margin."""


@dataclass(frozen=True)
class BertvizView:
    """One bertviz view, ready for ``st.iframe(view.html, height=view.height)`` or to save as a file.

    Attributes:
        kind: "head", "model" or "neuron".
        html: a whole page; it loads scripts only from its asset base, or none when they are inlined.
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


@dataclass(frozen=True)
class Shown:
    """The part of a trace a view shows: a token window, with positions renumbered from 0."""

    tokens: list[str]
    weights: np.ndarray  # (layer, head, q_pos, k_pos), all layers and heads of the window
    queries: np.ndarray  # (layer, head, pos, d_head)
    keys: np.ndarray  # (layer, head, pos, d_head)
    sentence_b_start: int | None


def shown(trace: AttentionTrace, token_window: tuple[int, int] | None) -> Shown:
    """The window ``token_window`` (half-open positions; None for all) of the trace."""
    start, stop = check_window(trace, token_window)
    b = trace.sentence_b_start
    # A window that holds only one of the two sentences is shown as one sentence.
    b_start = b - start if b is not None and start < b < stop else None
    return Shown(
        tokens=list(trace.labels[start:stop]),  # byte-level pieces decoded, a word's space drawn ␣
        weights=trace.weights[:, :, start:stop, start:stop],
        queries=trace.queries[:, :, start:stop],
        keys=trace.keys[:, :, start:stop],
        sentence_b_start=b_start,
    )


def quantize(x: np.ndarray) -> np.ndarray:
    """Round to the nearest 1/SCALE and return the integers (error at most 0.5/SCALE).

    Shape: same as ``x``, int32.
    """
    return np.rint(np.asarray(x, dtype=np.float64) * SCALE).astype(np.int32)


def pack_weights(q: np.ndarray) -> dict[str, Any]:
    """Quantized weights (``quantize`` of weights in [0, 1]) as ``aeExpand`` unpacks them: little-endian uint16, base64.

    Shape: any; the JSON carries it.
    """
    if q.size and (q.min() < 0 or q.max() > SCALE):
        raise ValueError("pack_weights takes quantized softmax weights, integers in 0..SCALE.")
    data = base64.b64encode(q.astype("<u2").tobytes()).decode("ascii")
    return {"ae_b64": data, "shape": list(q.shape)}


# Inlined into each view's page (a srcdoc iframe loads nothing it is not given).
_EXPAND_JS = f"<script>\n{(Path(__file__).parent / 'js' / 'bertviz_expand.js').read_text()}</script>\n"
_PAGE_STYLE = "<style>html, body { margin: 0; padding: 0; background: white; }</style>\n"


def safe_json(obj: Any) -> str:
    """JSON for inside a <script>: a token such as "</script>" must not end the script that carries it."""
    return json.dumps(obj, separators=(",", ":")).replace("</", "<\\/")


def find_params(html: str, marker: str) -> tuple[int, int, Any]:
    """Locate the JSON literal bertviz put after ``marker``: (start, end, decoded value)."""
    at = html.index(marker) + len(marker)
    value, end = json.JSONDecoder().raw_decode(html, at)
    return at, end, value


def compact_pairs(attention: list[dict[str, Any]]) -> None:
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


def finish(html: str, kind: str, params: dict[str, Any], span: tuple[int, int], asset_base: str | None) -> str:
    """bertviz's page with ``params`` (compact) at ``span``; scripts served from ``asset_base``, or inlined (None)."""
    start, end = span
    html = html[:start] + f"aeExpand({safe_json(params)}, {SCALE})" + html[end:]
    html = inline_scripts(html, kind) if asset_base is None else serve_scripts(html, kind, asset_base)
    return _PAGE_STYLE + _EXPAND_JS + html
