"""Home: a first heatmap of the text in the sidebar and where to start, above the fold; every page as a link below."""

import streamlit as st

from attention_explorer.figures import attention_heatmap
from ui.context import get_context
from ui.downloads import figure_config
from ui.guard import view_guard
from ui.home import every_page, start_here
from ui.state import head_fragment

HEATMAP_HEIGHT = 520  # with the title above it, the figure ends inside a 1000-pixel-high window

ctx = get_context()
shaped = ctx.trace if ctx.trace is not None else ctx.compact
st.title("Attention Explorer")
st.caption("How attention works inside a transformer: an encoder (BERT, or chapter 3's from scratch) or a decoder "
           "language model (GPT-2, a Llama). Type a text in the sidebar; every page reads the same forward pass.")
figure, paths = st.columns([3, 2], gap="large")
with paths:
    start_here(using_custom=ctx.request is not None and ctx.request.model == "custom",
               using_decoder=shaped is not None and bool(shaped.is_decoder))
st.divider()
st.subheader("Every page")
every_page()
st.caption("A **pretrained model** is a real checkpoint. Two ship with the app and work offline: MiniLM, a BERT "
           "encoder (the default), and SmolLM2-135M-Instruct, a Llama decoder; any other BERT, GPT-2 or "
           "Llama-family model loads from the Hugging Face hub or a folder. The **custom encoder** is the "
           "from-scratch transformer of chapter 3 of *Natural Language Processing with Transformers* (random seeded "
           "weights, or a BERT checkpoint's weights loaded into it).")

with figure:  # drawn last, above the rest: a long input's note stops the page here
    if ctx.trace is None and ctx.compact is not None:  # a long input: say where its compact form is drawn
        from ui.compact import needs_full_trace

        needs_full_trace(ctx.compact, ctx.settings.full_trace_mb)
    if ctx.trace is None:
        st.info(ctx.error or "Type a sentence in the sidebar.")
    else:
        t = ctx.trace

        def _first_heatmap(layer: int, head: int) -> None:
            """Reruns alone when the sidebar's layer or head changes."""
            st.subheader(f"Layer {layer}, head {head}")
            st.caption(f"of {t.n_layers} × {t.n_heads} · {t.n_tokens} tokens")
            with view_guard("heatmap"):
                matrix, labels, b = ctx.shown(t.weights[layer, head])  # words, when the sidebar asks for them
                st.plotly_chart(attention_heatmap(matrix, labels, sentence_b_start=b, reply_start=ctx.reply_start(),
                                                  height=HEATMAP_HEIGHT),
                                config=figure_config(f"attention_L{layer}_H{head}"), key="home_heatmap")
            st.caption("Row *i*: how token *i* (the query) spreads its attention over the tokens (the keys); each "
                       "row sums to 1. Darker = more. Pick another layer or head in the sidebar.")

        head_fragment("home_head", _first_heatmap, slot=ctx.head_slot, n_layers=t.n_layers, n_heads=t.n_heads,
                      settings=ctx.settings)
