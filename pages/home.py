"""Home: what the app shows, how to read each view, and a first heatmap of the default pair."""

import streamlit as st

from ui.context import get_context
from attention_explorer.figures import attention_heatmap
from ui.downloads import figure_config
from ui.guard import view_guard
from ui.state import head_fragment

st.title("Attention Explorer")
st.markdown(
    """
See how attention works inside a transformer: an encoder such as BERT, or a decoder language model such as
GPT-2 or a Llama. Pick a model and type a sentence, or a sentence pair, in the sidebar; every page reads the
same forward pass.

Every page, grouped as the menu is:

**Attention**
- **Attention heatmaps**: every layer × head at a glance, then one head in detail. Row *i* shows how
  token *i* (the query) spreads its attention over all tokens (the keys); each row sums to 1.
- **Why this key**: why the focused head attends where it does: its score split into the components
  (embeddings, earlier heads, MLPs) that wrote the query and the key, and which heads compose with which.
- **What the model predicts**: a decoder's most likely next tokens at every position, and the logit lens:
  what each layer would predict if it were the last.
- **Causal mask & masked scores**: the steps from scores QKᵀ/√d to the mask, the masked scores
  (−∞ where masked) and the softmax weights, bidirectional beside causal.
- **Inside the model**: chapter 3's walk from WordPiece tokens to the classifier logits, with the
  shape of every tensor; for a Llama-like decoder (SmolLM2, Llama, Qwen, Mistral, Gemma) the same walk through
  one block: RMSNorm, the q/k/v projections, the rotary embedding, shared key/value heads, the causal mask,
  softmax, the output projection, the gated MLP and the next token.
- **bertviz views**: bertviz's head, model and neuron views, served offline.

**Analyses**
- **One word, two contexts**: the same word's attention and representation in two sentences.
- **Rollout & flow**: attention rolled out through the layers, with the residual stream counted.
- **Norm-weighted attention**: attention weighted by the size of what each key's value writes.
- **Head statistics**: each head's entropy, distance and favourite tokens.
- **Head masking**: switch heads off and see what changes.
- **Head roles**: which heads look at the previous token, repeat an earlier one or copy (induction).

**Effects**
- **Contributions**: how much each token and head contributes to every representation (a graph).
- **Direct logit attribution**: each head's, MLP's and the embedding's direct effect on the next-token logit.
- **Activation patching**: each head's effect when its output is taken from a clean prompt into a corrupted
  one, for one pair or the mean over a dataset.
- **Circuits**: the edges between components that carry a task over a dataset (EAP, EAP-IG), the circuit
  drawn, and its faithfulness.

**Generation**
- **Generate**: a decoder's reply token by token, with the attention of each new token.
- **KV cache**: what a compressed key/value cache keeps (StreamingLLM, SnapKV, TOVA...) and what it costs.

**Corpus**
- **Corpus statistics**: head statistics over many texts, in a streamed run that can resume.
- **Query–key space & nearest contexts**: every token's query and key in one space, and its nearest contexts.

A **pretrained model** is a real checkpoint. Two ship with the app and work offline: MiniLM, a BERT encoder
(the default), and SmolLM2-135M-Instruct, a Llama decoder; any other BERT, GPT-2 or Llama-family model loads
from the Hugging Face hub or a folder. The **custom encoder** is the from-scratch transformer of chapter 3 of
*Natural Language Processing with Transformers* (random seeded weights, or a BERT checkpoint's weights loaded
into it).
"""
)
ctx = get_context()
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
        st.caption(t.description)
        with view_guard("heatmap"):
            matrix, labels, b = ctx.shown(t.weights[layer, head])  # words, when the sidebar asks for them
            st.plotly_chart(attention_heatmap(matrix, labels, sentence_b_start=b, reply_start=ctx.reply_start()),
                            config=figure_config(f"attention_L{layer}_H{head}"),
                            key="home_heatmap")
        st.caption("Darker = more attention. The dotted line marks where sentence B starts. Pick another layer "
                   "or head in the sidebar, or open **Attention heatmaps** for all of them.")

    head_fragment("home_head", _first_heatmap, slot=ctx.head_slot, n_layers=t.n_layers, n_heads=t.n_heads,
                  settings=ctx.settings)
