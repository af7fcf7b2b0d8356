"""How much bertviz may draw: the SVG elements a view would draw, and the check that keeps the tab responsive.

bertviz draws every line of a view in one JavaScript task; past ``MAX_ELEMENTS`` the tab freezes. The
bertviz page checks a view here before it builds it, and offers a token window, fewer heads, or the
heatmaps instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from model_core.trace.trace import AttentionTrace

VIEW_KINDS = ("head", "model", "neuron")

# SVG elements the browser draws within about 3 s on a busy 2-core machine (bench/bench_bertviz.py:
# drawing time grows linearly with the number of elements, about 25-50k elements a second, all of
# it in one JavaScript task that freezes the tab). Past this, the page offers a token window,
# fewer heads, or the heatmaps instead.
MAX_ELEMENTS = 100_000
# What a view shows first when the whole input is over MAX_ELEMENTS: for the views that the sidebar's layer or
# head redraws, a window the browser draws in a few tenths of a second (SmolLM2's head view of a 512-token input,
# layer change: 1.4-2.0 s at 100k elements, 0.38-0.55 s at 20k, 0.28-0.38 s at 10k); the slider widens it up to
# MAX_ELEMENTS. The model view shows every layer and head, so no sidebar change redraws it: it starts at its most.
DEFAULT_ELEMENTS = {"head": 15_000, "neuron": 15_000, "model": MAX_ELEMENTS}


@dataclass(frozen=True)
class SizeCheck:
    """Whether a view stays responsive in the browser.

    Attributes:
        ok: True when ``n_elements`` is within ``limit``.
        n_elements: SVG elements the view would draw.
        limit: the most elements a view may draw (``MAX_ELEMENTS``).
        max_tokens: the longest input (or token window) that fits within ``limit``.
        default_tokens: the window to show first when the input does not fit: at most ``max_tokens``, and
            within the kind's ``DEFAULT_ELEMENTS`` (a quick redraw).
        message: what to tell the user when not ok; empty when ok.
    """

    ok: bool
    n_elements: int
    limit: int
    max_tokens: int
    default_tokens: int
    message: str = field(default="")



def check_window(trace: AttentionTrace, token_window: tuple[int, int] | None) -> tuple[int, int]:
    """The half-open span of positions to show; the whole input when ``token_window`` is None.

    Raises:
        ValueError: the window is empty or outside the input; the message gives the valid range.
    """
    if token_window is None:
        return 0, trace.n_tokens
    start, stop = (int(x) for x in token_window)
    if not 0 <= start < stop <= trace.n_tokens:
        raise ValueError(
            f"token window {token_window} must satisfy 0 <= start < stop <= {trace.n_tokens} "
            f"(this input has {trace.n_tokens} tokens)."
        )
    return start, stop



def check_indices(name: str, values: list[int] | None, size: int) -> list[int]:
    """The ``name`` indices to show (all ``size`` of them for None), checked.

    Raises:
        ValueError: none, one out of range, or one repeated; the message gives the valid range.
    """
    if values is None:
        return list(range(size))
    values = [int(v) for v in values]
    if not values:
        raise ValueError(f"choose at least one {name}; this model has {name}s 0-{size - 1}.")
    bad = [v for v in values if not 0 <= v < size]
    if bad:
        raise ValueError(f"{name} {bad} out of range: this model has {name}s 0-{size - 1}.")
    if len(set(values)) != len(values):
        raise ValueError(f"{name}s {values} repeat an index; list each {name} once.")
    return values



# -- element counts: the measure of drawing time ---------------------------------------------------
def count_elements(kind: str, n_tokens: int, n_layers: int, n_heads: int, d_head: int) -> int:
    """SVG elements bertviz draws for a view of ``n_tokens`` tokens (the dominant terms).

    head: one line per (head, q_pos, k_pos) of the selected layer plus two highlight boxes per
    (head, token); model: one line per (layer, head, q_pos, k_pos); neuron: for one head, seven
    n x n families (lines, connectors, highlights) plus three n x d_head vector grids.
    """
    n = n_tokens
    if kind == "head":
        return n_heads * n * n + 2 * n_heads * n + 4 * n
    if kind == "model":
        return n_layers * n_heads * (n * n + 2) + 2 * n
    if kind == "neuron":
        return 7 * n * n + 3 * n * (d_head + 1) + 8 * n
    raise ValueError(f"kind {kind!r} is not one of {', '.join(VIEW_KINDS)}.")


def _most_tokens(kind: str, n_tokens: int, n_layers: int, n_heads: int, d_head: int, limit: int) -> int:
    """The longest window of at most ``n_tokens`` whose view draws at most ``limit`` elements (at least 1)."""
    most = 1
    while most < n_tokens and count_elements(kind, most + 1, n_layers, n_heads, d_head) <= limit:
        most += 1
    return most


def check_size(kind: str, trace: AttentionTrace, layers: list[int] | None = None, heads: list[int] | None = None,
               token_window: tuple[int, int] | None = None, limit: int = MAX_ELEMENTS) -> SizeCheck:
    """Whether bertviz's ``kind`` view of this selection stays responsive.

    Raises:
        ValueError: an unknown kind, or layers, heads or window out of range.
    """
    start, stop = check_window(trace, token_window)
    n_layers = len(check_indices("layer", layers, trace.n_layers))
    # The head view draws every head sent (ticked or not), the neuron view one head.
    n_heads = len(check_indices("head", heads, trace.n_heads))
    n_elements = count_elements(kind, stop - start, n_layers, n_heads, trace.d_head)
    max_tokens = _most_tokens(kind, trace.n_tokens, n_layers, n_heads, trace.d_head, limit)
    default_tokens = _most_tokens(kind, max_tokens, n_layers, n_heads, trace.d_head, min(limit, DEFAULT_ELEMENTS[kind]))
    if n_elements <= limit:
        return SizeCheck(True, n_elements, limit, max_tokens, default_tokens)
    message = (
        f"bertviz's {kind} view of {stop - start} tokens would draw about {n_elements:,} SVG elements; "
        f"past {limit:,} the browser stops responding. Show a token window of at most {max_tokens} tokens"
        + {"model": ", fewer layers or heads,", "head": ", fewer heads,"}.get(kind, "")
        + " or use the heatmaps, which have no such limit."
    )
    return SizeCheck(False, n_elements, limit, max_tokens, default_tokens, message)
