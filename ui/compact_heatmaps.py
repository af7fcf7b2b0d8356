"""The Attention heatmaps page for a long input in compact form: every layer x head pooled, the focused head pooled
at full extent (or by sentence or line), an exact window picked by a box or by ranges, and the first-token sink
apart, with the window renormalised without it on request."""

from __future__ import annotations

import numpy as np
import streamlit as st

from attention_explorer.figures import HeadGrid, layer_head_grids, overview_mosaic
from model_core.compact.trace import CompactTrace
from model_core.compact.summary import largest_weights
from model_core.compact.views import (
    coarser_overview,
    first_token_share,
    group_labels,
    group_means,
    pooled_head,
    segment_starts,
    window_without_first,
)
from model_core.io.tables import matrix_to_csv, token_matrix_to_csv
from model_core.trace.forward import full_trace_bytes
from ui.compact_figures import (
    first_token_figure,
    grouped_head_figure,
    pooled_head_figure,
    window_figure,
)
from ui.context import AppContext
from ui.downloads import figure_config
from ui.guard import memory_guard, view_guard
from ui.focus import set_focus
from ui.state import head_fragment
from ui.trace_cache import per_trace

WINDOW = 128
FOCUS_CELLS = 64
"""The focused head's cells a side: twice the stored overview's, computed exactly for that head on demand."""
"""The widest exact window, in positions: 128 x 128 weights with a hover each."""
ROWS, COLS = "cw_rows", "cw_cols"
FOCUS = "compact_focus"
STAT_TITLES = {"entropy": "Entropy (bits)", "to_first": "Share to the first token", "to_prev": "Share to the "
               "previous token", "mean_distance": "Mean distance (tokens)"}


@per_trace()
def _mosaic(trace: CompactTrace, cells: int) -> np.ndarray:
    return coarser_overview(trace, cells)


@per_trace()
def _pooled(trace: CompactTrace, layer: int, head: int) -> tuple[np.ndarray, int]:
    return pooled_head(trace, layer, head, FOCUS_CELLS)


@per_trace(spinner="Grouping the head's attention…")
def _grouped(trace: CompactTrace, layer: int, head: int, by: str) -> tuple[np.ndarray, list[str]]:
    starts = segment_starts(trace.tokens, by)
    return group_means(trace, layer, head, starts), group_labels(trace.tokens, starts, byte_level=trace.byte_level)


def _clamp(lo: int, hi: int, n: int) -> tuple[int, int]:
    lo, hi = max(0, min(lo, n - 1)), max(1, min(hi, n))
    if hi <= lo:
        hi = min(n, lo + 1)
    if hi - lo > WINDOW:
        hi = lo + WINDOW
    return lo, hi


def _box_to_window(n: int) -> None:
    """A box drawn on the pooled head becomes the window (positions; at most WINDOW a side)."""
    boxes = st.session_state.get("compact_pooled", {}).get("selection", {}).get("box", [])
    if boxes:
        x0, x1 = sorted(boxes[0]["x"])
        y0, y1 = sorted(boxes[0]["y"])
        st.session_state[ROWS] = _clamp(int(round(y0)), int(round(y1)) + 1, n)
        st.session_state[COLS] = _clamp(int(round(x0)), int(round(x1)) + 1, n)


def _overview(ctx: AppContext) -> None:
    t = ctx.compact
    cells = 16 if t.n_layers * t.n_heads > 150 else 32
    mosaic_cells = _mosaic(t, cells)

    def clicked() -> None:
        points = st.session_state["compact_overview"].get("selection", {}).get("points", [])
        picked = [p for p in points if p.get("curve_number") == 1 and "point_index" in p]
        if picked:
            set_focus(*divmod(int(picked[0]["point_index"]), ctx.n_heads))
            st.rerun(scope="app")

    st.subheader("Overview: every layer × head")
    st.caption(f"Each head pooled to {mosaic_cells.shape[-1]} × {mosaic_cells.shape[-1]} exact block means (a cell is "
               "the share of attention a block of queries gives a block of keys; rows sum to 1). Click a head to "
               "focus it.")
    with view_guard("overview"):
        st.plotly_chart(overview_mosaic(mosaic_cells, max_cells=mosaic_cells.shape[-1]),
                        config=figure_config("attention_overview_compact"), key="compact_overview",
                        on_select=clicked, selection_mode="points")


def _focused(ctx: AppContext, layer: int, head: int) -> None:
    t = ctx.compact
    n = t.n_tokens
    st.subheader(f"Layer {layer}, head {head}")
    view = st.radio("Cells", ["equal blocks", "sentences", "lines"], horizontal=True, key="compact_group",
                    help="Group the tokens as the overview does (equal blocks of positions), or by sentence or by "
                         "line, as SAVIS and LIT do. Every cell is an exact mean.")
    with view_guard("focused head"):
        if view == "equal blocks":
            cells, pool = _pooled(t, layer, head)
            fig = pooled_head_figure(cells, pool, t.labels, f"Pooled at full extent: {pool} positions a cell (exact block means)",
                                     reply_start=t.reply_start)
            st.plotly_chart(fig, config=figure_config(f"compact_L{layer}_H{head}"), key="compact_pooled",
                            on_select=lambda: _box_to_window(n), selection_mode="box")
            st.caption("Drag a box on it to draw that window exactly below.")
        else:
            by = "sentence" if view == "sentences" else "line"
            cells, labels = _grouped(t, layer, head, by)
            st.plotly_chart(grouped_head_figure(cells, labels, f"By {by}: {len(labels)} groups"),
                            config=figure_config(f"compact_L{layer}_H{head}_{by}"), key="compact_grouped")
    share = first_token_share(t, layer, head)
    st.plotly_chart(first_token_figure(share, f"Weight on the first token (the sink): mean {share.mean():.3f}",
                                       reply_start=t.reply_start),
                    config=figure_config(f"compact_sink_L{layer}_H{head}"), key="compact_sink")
    _window(ctx, layer, head, share)


@st.fragment
@memory_guard()  # its own reruns are outside app.py's handler
def _window(ctx: AppContext, layer: int, head: int, share: np.ndarray) -> None:
    """The exact window and its controls: a fragment of its own inside the head's, so moving a range redraws the
    window alone, not the pooled head and the sink line above it."""
    t = ctx.compact
    n = t.n_tokens
    st.markdown(f"**Exact window** — at most {WINDOW} × {WINDOW} positions; every hover is the model's weight.")
    st.session_state.setdefault(ROWS, (max(0, n - WINDOW), n))
    st.session_state.setdefault(COLS, (0, min(WINDOW, n)))
    c1, c2 = st.columns(2)
    rows = _clamp(*c1.slider("Query positions", 0, n, key=ROWS), n)
    cols = _clamp(*c2.slider("Key positions", 0, n, key=COLS), n)
    if rows != st.session_state[ROWS] or cols != st.session_state[COLS]:
        st.caption(f"Shortened to {WINDOW} positions a side.")
    drop_first = st.toggle("Leave out the first token and renormalise each row without it", key="compact_no_sink",
                           help="Each row divided by 1 − its weight on token 0: how the head spreads what it does "
                                "not give the sink.")
    weights = t.weights(layer, head, slice(*rows), slice(*cols))
    masked = ~t.masks[t.mask_of_layer[layer], rows[0]:rows[1], cols[0]:cols[1]]
    title = f"Queries {rows[0]}–{rows[1] - 1} × keys {cols[0]}–{cols[1] - 1}"
    if drop_first:
        weights = window_without_first(weights, share[rows[0]:rows[1]], slice(*cols))
        if cols[0] == 0:
            masked, cols = masked[:, 1:], (1, cols[1])
        title += ", renormalised without the first token"
    with view_guard("window"):
        st.plotly_chart(window_figure(weights, t.labels, rows, cols, masked, title,
                                      "weight" if not drop_first else "share without token 0",
                                      reply_start=t.reply_start),
                        config=figure_config(f"compact_window_L{layer}_H{head}"), key="compact_window")
    st.download_button("This window (CSV)", lambda: token_matrix_to_csv(
        weights, t.tokens[rows[0]:rows[1]], t.tokens[cols[0]:cols[1]], row_positions=range(*rows),
        col_positions=range(*cols)), file_name=f"window_L{layer}_H{head}_{rows[0]}-{rows[1]}x{cols[0]}-{cols[1]}.csv",
        mime="text/csv", on_click="ignore", key="compact_window_csv")


OWN_RANGE = {"entropy": (None, None), "mean_distance": (None, None)}
"""The statistics that are not shares (a share's grid runs from 0 to 1, and the shares have one colour bar)."""
ALL_STATS = {**STAT_TITLES, "to_self": "Share to self", "to_next": "Share to the next token",
             "max_weight": "Largest weight"}


@per_trace()
def _largest(trace: CompactTrace) -> np.ndarray:
    bar = st.progress(0.0, text="Largest weight of every head: one pass over each layer…")
    values = largest_weights(trace, lambda done: bar.progress(done, text=f"Largest weight of every head… {done:.0%}"))
    bar.empty()
    return values


def _stats(t: CompactTrace, every: bool) -> dict[str, np.ndarray]:
    """The statistics to draw; the largest weight, which the app's trace leaves out, once asked for."""
    stats = dict(t.stats)
    if every and "max_weight" not in stats:
        if st.toggle("Largest weight of every head too", key="compact_largest",
                     help="One more pass over every layer (about 5 s at 4,096 tokens of SmolLM2 on a 2-core CPU); "
                          "computed once per text."):
            stats["max_weight"] = _largest(t)
    return stats


def draw_stats(ctx: AppContext, every: bool = False) -> None:
    """Layer x head grids of the compact trace's statistics (``every``: all of them, else the four main ones),
    with CSVs."""
    t = ctx.compact
    stats = _stats(t, every)
    shown = {name: title for name, title in (ALL_STATS if every else STAT_TITLES).items() if name in stats}
    st.subheader("Per-head summary")
    st.caption(f"{t.n_tokens:,} tokens in compact form. Each statistic is averaged over every query row, computed as "
               "a stream over blocks of rows while tracing (no n × n array was held)."
               + (" Shares to punctuation, to special tokens and across a sentence pair are computed for the full "
                  "form only." if every else ""))
    with view_guard("per-head summary"):  # one chart: one figure for the browser to draw, not one a statistic
        st.plotly_chart(layer_head_grids([HeadGrid(stats[name], title, *OWN_RANGE.get(name, (0.0, 1.0)))
                                          for name, title in shown.items()]),
                        config=figure_config("compact_head_summary"), key="compact_head_summary")
    labels = [f"layer {layer}" for layer in range(t.n_layers)]
    heads = [f"head {h}" for h in range(t.n_heads)]
    for name, title in shown.items():
        st.download_button(f"{title} (CSV)", lambda name=name: matrix_to_csv(stats[name], labels, heads),
                           file_name=f"compact_{name}.csv", mime="text/csv", on_click="ignore",
                           key=f"compact_csv_{name}")


def draw(ctx: AppContext) -> None:
    """The whole page for ``ctx.compact``."""
    t = ctx.compact
    st.title("Attention heatmaps")
    st.caption(f"{t.description} · {t.n_tokens:,} tokens · compact form · {t.dtype}")
    gb = full_trace_bytes(t.n_layers, t.n_heads, t.n_tokens) / 1e9
    st.info(f"**Compact form.** A full trace would hold {gb:,.1f} GB of weights ({t.n_layers} × {t.n_heads} × "
            f"{t.n_tokens:,}²); this one keeps the queries, keys, each row's log-sum-exp and exact block means "
            f"({t.nbytes() / 1e6:,.0f} MB), and computes any window exactly when it is drawn.",
            icon=":material/compress:")
    _overview(ctx)
    head_fragment(FOCUS, lambda layer, head: _focused(ctx, layer, head), slot=ctx.head_slot, n_layers=t.n_layers,
                  n_heads=t.n_heads, settings=ctx.settings)
    draw_stats(ctx)
