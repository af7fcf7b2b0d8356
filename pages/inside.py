"""Inside the model: chapter 3's walk from WordPiece tokens to the classifier logits, one step at a time; for a
Llama-like decoder the same walk through one block, from BPE pieces to the next token (``ui.inside_decoder``)."""

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from model_core import InputError, ModelLoadError
from model_core.families.decoder import NoBlockWalk
from ui.analysis_widgets import positions_outside_window
from ui.context import require_trace
from ui.downloads import figure_config
from attention_explorer.figures import SCORE_SCALE, attention_heatmap
from ui.guard import view_guard
from ui.state import head_fragment
from ui.loaders import get_walkthrough
from ui.inside_decoder import STEPS as DECODER_STEPS
from ui.inside_views import dims_title, norm_lines, shape_line, vector_row, vectors

ctx = require_trace()
t = ctx.trace
st.title("Inside a decoder block" if t.is_decoder else "Inside the encoder")


def no_block_walk(reason: str) -> None:
    """Why this decoder has no walk (GPT-2, Phi), and where its numbers are."""
    st.info(
        f"{reason}\n\nThe walk covers chapter 3's **encoder** (and BERT's weights in it) and **Llama-like decoder "
        "blocks**: RMSNorm, rotary position embeddings applied to the queries and keys, grouped-query attention and a "
        "gated feed-forward layer. This model's own numbers are on the other pages: its attention on **Attention "
        "heatmaps**, its causal mask and scores on **Causal mask & masked scores**, its queries and keys on "
        "**bertviz views** (neuron view).",
        icon=":material/info:",
    )
    c1, c2 = st.columns(2)
    c1.page_link("pages/heatmaps.py", label="Attention heatmaps", icon=":material/grid_view:")
    c2.page_link("pages/causal.py", label="Causal mask & masked scores", icon=":material/change_history:")


if ctx.request.model == "pretrained" and not t.is_decoder:  # a pretrained encoder's weights, walked in the chapter-3 encoder
    st.info(
        "This walk runs **BERT's weights inside the from-scratch encoder** of chapter 3 "
        "(`custom_from_bert`): its attentions and hidden states equal `transformers`' BertModel to 1e-4 "
        "(a parity test checks it). BERT ships no classifier, so the classifier head in the last step is "
        "**random (seed 0)**: its logits show the computation, not a prediction.",
        icon=":material/info:",
    )


def _tokens(wt, layer: int, head: int) -> None:
    n = wt.n_tokens
    st.markdown("The tokenizer splits the text into WordPiece units (`##` marks a piece that continues a word), "
                "adds `[CLS]` at the start and `[SEP]` after each sentence, and maps every token to its vocabulary id. "
                "The token type says which sentence a token belongs to.")
    with view_guard("token table"):
        st.dataframe(pd.DataFrame({"position": range(n), "token": wt.tokens, "id": wt.token_ids,
                                   "token type": ["A (0)" if k == 0 else "B (1)" for k in wt.token_type_ids]}),
                     hide_index=True, width="stretch", height=min(560, 40 + 35 * (n + 1)))
        shape_line(wt, "token_ids", "token_type_ids")


def _embeddings(wt, layer: int, head: int) -> None:
    hidden = wt.hidden_size
    st.markdown("Each id picks a row of the token embedding, each position a row of the learned position "
                "embedding, each token type a row of the token-type embedding. Their sum is normalised:")
    st.latex(r"x_i = \mathrm{LayerNorm}\big(E_{\mathrm{tok}}[\mathrm{id}_i] + E_{\mathrm{pos}}[i] + "
             r"E_{\mathrm{type}}[\mathrm{type}_i]\big)")
    with view_guard("embeddings"):
        tabs = st.tabs(["Token", "Position", "Token type", "Sum", "After LayerNorm"])
        for tab, (label, name) in zip(tabs, [("token embedding", "token_embeddings"),
                                             ("position embedding", "position_embeddings"),
                                             ("token-type embedding", "token_type_embeddings"),
                                             ("sum of the three", "embedding_sum"),
                                             ("after LayerNorm = input of layer 0", "embeddings")]):
            with tab:
                vectors(wt, name, dims_title(label, hidden), f"emb_{name}")
        st.plotly_chart(norm_lines(wt, {"token": "token_embeddings", "position": "position_embeddings",
                                    "token type": "token_type_embeddings", "sum": "embedding_sum",
                                    "after LayerNorm": "embeddings"}, "Norm of each token's embedding"),
                        config=figure_config("inside_embedding_norms"), key="emb_norms")


def _one_head(wt, layer: int, head: int) -> None:
    n, hidden, d_head = wt.n_tokens, wt.hidden_size, wt.d_head
    st.markdown(f"The head projects each token's vector (width {hidden}) to a query, a key and a value of width "
                f"d_head = {hidden} / {wt.n_heads} = {d_head}. Scores compare every query with every key; the softmax "
                "turns each row into weights that sum to 1; the output mixes the values with those weights.")
    st.latex(r"\mathrm{scores} = \frac{Q K^\top}{\sqrt{d_\mathrm{head}}}, \quad "
             r"\mathrm{weights} = \mathrm{softmax}(\mathrm{scores}), \quad \mathrm{output} = \mathrm{weights}\, V")
    with view_guard("queries, keys and values"):
        cols = st.columns(3)
        for col, (label, name) in zip(cols, [("Q (queries)", "queries"), ("K (keys)", "keys"), ("V (values)", "values")]):
            with col:
                vectors(wt, name, label, f"qkv_{name}", head=head, max_dims=d_head, shapes=())
        st.caption(f"Each is (pos, d_head) = ({n}, {d_head}) for this head; `queries` for all heads of the layer "
                   f"has shape {wt.shapes()['queries']}.")
    with view_guard("scores and weights"):
        hide = positions_outside_window(n, "inside_window", "scores and weights")
        c1, c2 = st.columns(2)
        with c1:
            st.plotly_chart(attention_heatmap(wt.masked_scores[head], wt.tokens, title="Scores QKᵀ/√d_head"
                                              + (" after the causal mask (−∞ above the diagonal)" if wt.causal else ""),
                                              sentence_b_start=wt.sentence_b_start, colorscale=SCORE_SCALE, hide=hide,
                                              zmin=-wt.score_limit(head), zmax=wt.score_limit(head), value_name="score",
                                              reply_start=t.reply_start),  # the walk is in pieces
                            config=figure_config(f"inside_scores_H{head}"), key="scores")
            shape_line(wt, "scores")
        with c2:
            st.plotly_chart(attention_heatmap(wt.weights[head], wt.tokens, title="Weights = softmax(scores)",
                                              sentence_b_start=wt.sentence_b_start, hide=hide,
                                              reply_start=t.reply_start),
                            config=figure_config(f"inside_weights_H{head}"), key="weights")
            shape_line(wt, "weights")
    with view_guard("head output"):
        vectors(wt, "head_outputs", "Head output = weights @ V", "head_out", head=head, max_dims=d_head)


def _concat(wt, layer: int, head: int) -> None:
    hidden, d_head = wt.hidden_size, wt.d_head
    st.markdown(f"The {wt.n_heads} head outputs, each of width {d_head}, are laid side by side "
                f"(head {head} fills columns {head * d_head}–{(head + 1) * d_head - 1}) and mixed by one linear layer "
                "W_O, so every output dimension can draw on every head.")
    st.latex(r"\mathrm{MultiHead}(x) = \mathrm{Concat}(\mathrm{head}_0, \dots, \mathrm{head}_{h-1})\, W_O^\top + b_O")
    with view_guard("concatenation"):
        vector_row(wt, dict(name="concat", title=f"Concatenated heads (all {hidden} dims)", key="concat",
                            max_dims=hidden, mark=(head * d_head, (head + 1) * d_head)),
                   dict(name="attention_output", title=dims_title("After W_O", hidden), key="attn_out"))


def _ffn(wt, layer: int, head: int) -> None:
    hidden = wt.hidden_size
    st.markdown(f"Each position goes on its own through linear ({hidden} → {wt.intermediate_size}), GELU, "
                f"linear ({wt.intermediate_size} → {hidden}). GELU keeps positive inputs and squashes negative "
                "ones towards 0, so most intermediate activations end near zero.")
    st.latex(r"\mathrm{FFN}(x) = W_2\, \mathrm{GELU}(W_1 x + b_1) + b_2")
    with view_guard("feed-forward"):
        vector_row(wt, dict(name="ffn_hidden", title=dims_title("W₁x + b₁ (before GELU)", wt.intermediate_size),
                            key="ffn_hidden"),
                   dict(name="ffn_activation", title=dims_title("GELU activation", wt.intermediate_size), key="ffn_act"))
        vectors(wt, "ffn_output", dims_title("FFN output", hidden), "ffn_out", shapes=("ffn_input", "ffn_output"))


def _residual(wt, layer: int, head: int) -> None:
    if wt.norm_placement == "pre":
        st.markdown("This model uses **pre-LayerNorm** (the book's choice): each sublayer reads a normalised copy, "
                    "and the residual stream itself is never normalised inside the layer, so its norm can grow "
                    "layer by layer. Training is more stable this way.")
        st.latex(r"x' = x + \mathrm{Attn}(\mathrm{LN}_1(x)), \qquad y = x' + \mathrm{FFN}(\mathrm{LN}_2(x'))")
        series = {"layer input x": "layer_input", "x' = x + Attn": "residual_1", "LN₂(x') (FFN input)": "ffn_input",
                  "y = x' + FFN (layer output)": "layer_output"}
    else:
        st.markdown("This model uses **post-LayerNorm** (the original Transformer and BERT): each residual sum is "
                    "normalised, so the stream leaving every sublayer has a comparable norm.")
        st.latex(r"x' = \mathrm{LN}_1(x + \mathrm{Attn}(x)), \qquad y = \mathrm{LN}_2(x' + \mathrm{FFN}(x'))")
        series = {"layer input x": "layer_input", "x + Attn (before LN₁)": "residual_1", "x' = LN₁(…)": "ffn_input",
                  "x' + FFN (before LN₂)": "residual_2", "y = LN₂(…) (layer output)": "layer_output"}
    with view_guard("residual stream"):
        st.plotly_chart(norm_lines(wt, series, f"Norm of each token's vector through layer {layer}"),
                        config=figure_config(f"inside_norms_L{layer}"), key="norms")
        shape_line(wt, "layer_input", "residual_1", "layer_output")


def _classifier(wt, layer: int, head: int) -> None:
    hidden = wt.hidden_size
    st.markdown(f"After the last layer, the `[CLS]` vector (width {hidden}) goes through dropout (off at inference) "
                f"and one linear layer to {len(wt.logits)} logits; a softmax turns them into probabilities.")
    if ctx.request.model == "pretrained":
        st.caption("The classifier's weights are random (seed 0): BERT has no trained classifier head here.")
    else:
        st.caption("The classifier's weights are as random as the rest of this encoder: it was never trained.")
    with view_guard("classifier"):
        c1, c2 = st.columns([2, 1])
        with c1:
            labels = [f"label {i}" for i in range(len(wt.logits))]
            fig = go.Figure(go.Bar(x=labels, y=wt.logits, text=[f"{v:.3f}" for v in wt.logits], textposition="outside",
                                   hovertemplate="%{x}: logit %{y:.4f}<extra></extra>"))
            fig.update_layout(title=dict(text="Logits", font=dict(size=13)), height=280,
                              margin=dict(l=10, r=10, t=36, b=10))
            st.plotly_chart(fig, config=figure_config("inside_logits"), key="logits")
        with c2:
            st.dataframe(pd.DataFrame({"label": labels, "logit": wt.logits, "probability": wt.probabilities}),
                         hide_index=True)
        shape_line(wt, "final_hidden", "logits")


# (title, body, open at first): a closed step builds nothing (its expander reruns the walk when opened).
ENCODER_STEPS = (
    ("1 · WordPiece tokens and ids", _tokens, True),
    ("2 · Embeddings", _embeddings, False),
    ("3 · Layer {layer}, head {head}: queries, keys, values and attention", _one_head, True),
    ("4 · Concatenate the heads, then the output projection", _concat, False),
    ("5 · Feed-forward layer", _ffn, False),
    ("6 · Residual connections and LayerNorm placement", _residual, False),
    ("7 · Classifier on [CLS]", _classifier, False),
)


def _walk(layer: int, head: int) -> None:
    """The walk for one layer and head, one folded step each; a change of layer or head reruns only this."""
    try:
        wt = get_walkthrough(ctx.request, layer)  # its own spinner, or its place in the queue
    except NoBlockWalk as exc:
        no_block_walk(str(exc))
        return
    except (InputError, ModelLoadError, ValueError) as exc:
        st.warning(f"The walk cannot run for this model: {exc}")
        return
    st.caption(f"{t.description} · {t.n_tokens} tokens · layer {layer}, head {head} (change them in the sidebar). "
               "Open a step to see it; a closed step is not computed or sent.")
    steps = DECODER_STEPS if t.is_decoder else ENCODER_STEPS
    for index, (title, body, open_at_first) in enumerate(steps):
        box = st.expander(title.format(layer=layer, head=head), expanded=open_at_first, key=f"inside_step{index + 1}",
                          on_change="rerun")
        if box.open:
            with box:
                body(wt, layer, head)


head_fragment("inside_head", _walk, slot=ctx.head_slot, n_layers=t.n_layers, n_heads=t.n_heads, settings=ctx.settings)
