"""bertviz's head, model and neuron views of an AttentionTrace: offline, compact, sized to fit, exportable.

``view_html`` builds any of the three; ``standalone_html`` turns a view built with ``asset_base=None``
(its JavaScript inlined) into a file that opens anywhere with no outside request.
"""

from __future__ import annotations

import html as html_lib

from attention_explorer.views.assets import (
    DEFAULT_ASSET_BASE,
    VENDOR_FILES,
    vendor_missing,
)
from attention_explorer.views.attention import (
    attention_view_html,
    bertviz_inputs,
    head_view_html,
    model_view_html,
)
from attention_explorer.views.neuron import (
    kv_head_groups,
    kv_legend,
    neuron_params,
    neuron_view_html,
)
from attention_explorer.views.page import SCALE, BertvizView, quantize
from attention_explorer.views.size import (
    MAX_ELEMENTS,
    VIEW_KINDS,
    SizeCheck,
    check_size,
)
from model_core.trace.trace import AttentionTrace

__all__ = [
    "DEFAULT_ASSET_BASE",
    "MAX_ELEMENTS",
    "SCALE",
    "VENDOR_FILES",
    "VIEW_KINDS",
    "BertvizView",
    "SizeCheck",
    "attention_view_html",
    "bertviz_inputs",
    "check_size",
    "head_view_html",
    "kv_head_groups",
    "kv_legend",
    "model_view_html",
    "neuron_params",
    "neuron_view_html",
    "quantize",
    "standalone_html",
    "vendor_missing",
    "view_html",
]


def view_html(kind: str, trace: AttentionTrace, layers: list[int] | None = None, heads: list[int] | None = None,
              token_window: tuple[int, int] | None = None, asset_base: str | None = DEFAULT_ASSET_BASE) -> BertvizView:
    """One of the three views by name, with ``attention_view_html``'s arguments; for "neuron" the first of
    ``layers`` and ``heads`` is shown. ``asset_base=None`` inlines require.js, d3 and jQuery (a notebook, a
    downloaded file).
    """
    if kind in ("head", "model"):
        return attention_view_html(kind, trace, layers, heads, token_window, asset_base)
    if kind == "neuron":
        return neuron_view_html(trace, (layers or [0])[0], (heads or [0])[0], token_window, asset_base)
    raise ValueError(f"kind {kind!r} is not one of {', '.join(VIEW_KINDS)}.")


def standalone_html(view: BertvizView, title: str = "bertviz view") -> str:
    """A whole HTML document of ``view``, to save as a file; its scripts must be inlined (``asset_base=None``).

    Raises:
        ValueError: the view loads its scripts from a server, so the file would draw nothing elsewhere.
    """
    if "<script src=" in view.html:
        raise ValueError("this view loads its scripts from a server; build it with asset_base=None to save it.")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html_lib.escape(title)}</title>'
            f"</head>\n<body>\n{view.html}\n</body></html>\n")
