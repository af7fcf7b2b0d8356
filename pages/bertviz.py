"""bertviz's head, model and neuron views of the shared trace, drawn offline from local JavaScript."""

from pathlib import Path

import streamlit as st

from attention_explorer import views as bv
from attention_explorer.views.size import check_size
from model_core.words import span_text, word_level_trace
from ui.context import require_trace
from ui.guard import view_guard

STATIC = Path(__file__).resolve().parents[1] / "static"
HEATMAPS_PAGE = "pages/heatmaps.py"
VIEW_LABELS = {
    "head": "Head view",
    "model": "Model view",
    "neuron": "Neuron view",
}
VIEW_HELP = {
    "head": "Lines from each token (left) to the tokens it attends to (right), one colour per head of the "
            "chosen layer. Click a colour square to hide or show a head; double-click to show only it. "
            "Hover a token to see only its lines.",
    "model": "One thumbnail per layer and head (rows: layers, columns: heads). Click a thumbnail to enlarge it.",
    "neuron": "How one head computes its weights: hover a token on the left, then click the ⊕ beside it to "
              "see its query q, every key k, their elementwise product, the dot product q·k/√d and the "
              "softmax. The vectors come from the trace, so this works for the custom encoder too.",
}



def _view_trace(words: bool):
    """The trace the view draws: the run's, or its words' (``word_level_trace``) for the head and model views."""
    return word_level_trace(ctx.trace, ctx.words, ctx.weights()) if words else ctx.trace


ctx = require_trace()
t, layer, head = ctx.trace, ctx.focus.layer, ctx.focus.head
st.title("bertviz views")
st.caption(f"{t.description} · {t.n_tokens} tokens · layer {layer}, head {head} (sidebar)")
if t.causal:
    st.caption(f"This {t.family.label} is causal: a token's lines go only to itself and the tokens before it.")

missing = bv.vendor_missing(str(STATIC))
if missing:
    st.info(f"bertviz's views need four JavaScript files that are not installed here ({', '.join(missing)} missing "
            "from static/vendor/). They come from npm: install Node.js and npm (Debian: `apt-get install nodejs npm`), "
            "run `make setup`, and reload this page. Every other page works without them; the Attention heatmaps "
            "page shows the same weights.")
    st.page_link(HEATMAPS_PAGE, label="Open the Attention heatmaps", icon=":material/grid_view:")
    st.stop()

MAX_VIEW_PX = 1000
kind = st.radio("View", list(VIEW_LABELS), format_func=VIEW_LABELS.get, horizontal=True, key="bv_kind")
st.caption(VIEW_HELP[kind])
if kind == "neuron":
    if t.is_decoder:
        st.caption("The queries and keys are the model's own, as it multiplies them: after the rotary embedding "
                   "where it has one. The view draws q·k/√d and its softmax over the keys up to the query.")
    legend = bv.kv_legend(t)
    if legend:
        st.info(f"Grouped-query attention. {ctx.kv_sharing(head)} {legend}. Heads that share a key/value head "
                "have the same keys; the view's head menu names each head's (\"4 · kv 1\").",
                icon=":material/group_work:")
if ctx.words is not None:
    if kind == "neuron":
        st.caption(f"Words, not {ctx.pieces}: the neuron view stays in {ctx.pieces}, because queries and keys "
                   "belong to pieces.")
    else:
        # The head and model views read only the weights and the tokens: give them the words.
        t = _view_trace(words=True)
        st.info(ctx.words_note(), icon=":material/join:")

layers: list[int] | None
heads: list[int] | None
if kind == "head":
    c1, c2 = st.columns([1, 2])
    all_layers = c1.toggle("All layers in the view's layer menu", key="bv_all_layers",
                           help="Off: only the sidebar's layer is sent to the browser (smaller and faster).")
    heads = c2.multiselect("Heads", range(t.n_heads), default=list(range(t.n_heads)), key="bv_head_heads",
                           help="The colour squares stand for these heads, in this order.") or None
    layers = None if all_layers else [layer]
elif kind == "model":
    c1, c2 = st.columns(2)
    layers = c1.multiselect("Layers", range(t.n_layers), default=list(range(t.n_layers)), key="bv_layers") or None
    heads = c2.multiselect("Heads", range(t.n_heads), default=list(range(t.n_heads)), key="bv_heads") or None
else:
    layers, heads = [layer], [head]
    st.caption(f"Layer {layer}; the view's head menu starts at head {head}. Change the layer in the sidebar.")

size = check_size(kind, t, layers, heads)
window = None
if not size.ok:
    first = (f" It starts with the first {size.default_tokens}, which redraw in a few tenths of a second when the "
             "sidebar's layer or head changes; widen the window below." if size.default_tokens < size.max_tokens else "")
    st.warning(size.message + first, icon=":material/speed:")
    st.page_link(HEATMAPS_PAGE, label="Open the heatmaps instead", icon=":material/grid_view:")
if not size.ok or st.toggle("Show only a span of tokens", key="bv_use_window"):
    lo, hi = st.slider("Token window (positions, end excluded)", 0, t.n_tokens,
                       (0, min(size.default_tokens, t.n_tokens)), key="bv_window")
    if hi - lo > size.max_tokens:
        hi = lo + size.max_tokens
        st.caption(f"Shortened to {size.max_tokens} tokens, the most this view draws without freezing the browser.")
    if hi <= lo:
        lo, hi = (lo, lo + 1) if lo < t.n_tokens else (lo - 1, lo)
    window = (lo, hi)
    st.caption(f"Tokens {lo}–{hi - 1}: “{span_text(t.tokens[lo:hi], t.byte_level)}”. The lines are the full model's weights "
               "between these tokens; rows need not sum to 1 here, because weights to tokens outside the "
               "window are not drawn.")

with view_guard(f"bertviz {kind}"):
    view = bv.view_html(kind, t, layers, heads, token_window=window)
    # At most MAX_VIEW_PX tall: a longer view (the head view of 128 tokens is 2,100 px) scrolls inside its frame.
    st.iframe(view.html, height=min(view.height, MAX_VIEW_PX), alt=f"bertviz {VIEW_LABELS[kind].lower()}")
    st.caption(f"{len(view.html.encode()) / 1e3:,.0f} kB sent · about {view.n_elements:,} SVG elements · "
               "bertviz's own JavaScript, served by this app with d3 and jQuery from static/vendor/.")
    stem = f"bertviz_{kind}_L{layer}" + (f"_H{head}" if kind == "neuron" else "") + (
        f"_tokens{window[0]}-{window[1] - 1}" if window else "")
    st.download_button("Download this view (HTML, opens offline)", file_name=f"{stem}.html", mime="text/html",
                       icon=":material/download:", key="bv_download",
                       # The file itself, built with the page: a deferred build on click went through a backend round
                       # trip that a busy server could lose, and the bytes hold no trace after the run.
                       data=bv.standalone_html(bv.view_html(kind, t, layers, heads, token_window=window,
                                                            asset_base=None), stem),
                       help="One self-contained file: bertviz's script, d3, jQuery and require.js are inside it, "
                            "so it draws in any browser with no network.")

del t  # a words' trace is not the cache's: let it go with the run (ui.run_traces)
