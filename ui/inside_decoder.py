"""The steps of "Inside the model" for a Llama-like decoder block (``model_core.walk.decoder.DecoderWalk``):
RMSNorm, the q/k/v projections, the rotary embedding, key/value heads, scores, the causal mask, softmax, the output
projection, the gated MLP and the next token, one folded step each, a shape line per step as chapter 3 has."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from attention_explorer.figures import SCORE_SCALE, attention_heatmap, vector_heatmap
from model_core.words import markdown_text, shown_text
from ui.analysis_widgets import positions_outside_window
from ui.downloads import figure_config
from ui.guard import view_guard
from ui.inside_views import dims_title, norm_lines, shape_line, vector_row, vectors


def _latex_number(x: float) -> str:
    """1e-05 as "10^{-5}", 2.5e-06 as "2.5 \\times 10^{-6}" (LaTeX reads "1e-05" as 1·e − 05)."""
    if x == 0:
        return "0"
    mantissa, exponent = f"{x:.3e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    power = f"10^{{{int(exponent)}}}"
    return power if mantissa == "1" else rf"{mantissa} \times {power}"


def _sharing(wt, head: int) -> str:
    kv = int(wt.kv_heads[head])
    group = np.flatnonzero(wt.kv_heads == kv).tolist()
    if len(group) == 1:
        return f"Head {head} has key/value head {kv} to itself."
    return f"Head {head} reads key/value head {kv}, which heads {', '.join(map(str, group))} share."


def _tokens(wt, layer: int, head: int) -> None:
    n = wt.n_tokens
    st.markdown("The tokenizer splits the text into byte-level or SentencePiece **BPE pieces**: a piece that starts "
                "a word carries its space (drawn **␣** here), and a character outside the vocabulary is split into "
                "its bytes. Many models put a beginning-of-text token first. A decoder has no classifier or separator "
                "tokens and no token types: a pair is one text, A, a line break, then B.")
    with view_guard("token table"):
        st.dataframe(pd.DataFrame({"position": range(n), "piece": wt.tokens, "reads as": wt.labels,
                                   "id": wt.token_ids}),
                     hide_index=True, width="stretch", height=min(560, 40 + 35 * (n + 1)))
        shape_line(wt, "token_ids")


def _embeddings(wt, layer: int, head: int) -> None:
    hidden = wt.hidden_size
    scaled = (f" This model (as Gemma does) multiplies the lookup by √{hidden} ≈ {wt.lookup_scale:.1f} before the "
              "first block." if wt.lookup_scale != 1.0 else "")
    st.markdown("Each id picks one row of the token embedding. There is **no position embedding**: a Llama-like "
                "model tells positions apart only inside attention, by rotating queries and keys (step 5)." + scaled)
    st.latex(r"x^{(0)}_i = E_{\mathrm{tok}}[\mathrm{id}_i]")
    with view_guard("embeddings"):
        tabs = st.tabs(["Token embedding", f"Stream entering layer {layer}"])
        with tabs[0]:
            vectors(wt, "token_embeddings", dims_title("token embedding", hidden), "dec_emb")
        with tabs[1]:
            vectors(wt, "layer_input", dims_title(f"residual stream entering layer {layer}", hidden), "dec_layer_in")


def _rmsnorm(wt, layer: int, head: int) -> None:
    weight = r"(1 + w)" if wt.norm_plus_one else r"w"
    st.markdown("Before attention, each token's vector is divided by its root mean square and scaled per dimension "
                "by a learned weight. Unlike LayerNorm, RMSNorm subtracts no mean and adds no bias.")
    st.latex(r"\mathrm{RMSNorm}(x) = \frac{x}{\sqrt{\tfrac{1}{d}\sum_j x_j^2 + \varepsilon}} \odot " + weight
             + rf", \quad \varepsilon = {_latex_number(wt.rms_eps)}")
    with view_guard("RMSNorm"):
        vectors(wt, "attention_input", dims_title("RMSNorm(x), what the heads read", wt.hidden_size), "dec_rms1",
                shapes=("layer_input", "attention_input"))
        st.plotly_chart(norm_lines(wt, {"x (layer input)": "layer_input", "RMSNorm(x)": "attention_input"},
                                   "Norm of each token's vector before and after RMSNorm"),
                        config=figure_config(f"inside_rms1_L{layer}"), key="dec_rms1_norms")


def _qkv(wt, layer: int, head: int) -> None:
    d_head, kv = wt.d_head, int(wt.kv_heads[head])
    st.markdown(f"Three linear maps give every token a query for each of the {wt.n_heads} query heads and a key and "
                f"a value for each of the {wt.n_kv_heads} key/value heads, each of width d_head = {d_head}. "
                + ("Here every head has its own keys and values." if wt.n_kv_heads == wt.n_heads else
                   f"With **grouped-query attention** {wt.n_heads // wt.n_kv_heads} query heads share one key/value "
                   "head, so the keys and values take less memory.")
                + (" This model also normalises each head's query and key (RMSNorm) before the rotation."
                   if wt.qk_norm else ""))
    st.latex(r"q = x W_Q^\top, \quad k = x W_K^\top, \quad v = x W_V^\top")
    st.caption(_sharing(wt, head))
    with view_guard("queries, keys and values"):
        cols = st.columns(3)
        for col, (label, name, index) in zip(cols, [(f"q, head {head}", "queries_before_rotary", head),
                                                   (f"k, key/value head {kv}", "keys_before_rotary", kv),
                                                   (f"v, key/value head {kv}", "values", kv)]):
            with col:
                vectors(wt, name, label, f"dec_{name}", head=index, max_dims=d_head, shapes=())
        shape_line(wt, "queries_before_rotary", "keys_before_rotary", "values")


def _rotary(wt, layer: int, head: int) -> None:
    kv, d_head = int(wt.kv_heads[head]), wt.d_head
    change = np.abs(np.linalg.norm(wt.queries[head], axis=-1) / np.maximum(
        np.linalg.norm(wt.queries_before_rotary[head], axis=-1), 1e-12) - 1).max()
    st.markdown(f"The **rotary embedding** (RoPE; Su et al., 2021) turns dimension *j* and *j* + {d_head // 2} of a "
                "query or key at position *p* by an angle p·θⱼ, fast for the first dimensions and slow for the last. "
                "Values are not rotated. A score q·k then depends on the two positions only through their "
                "distance. The model's own rotation, recorded after it was applied:")
    st.latex(r"q' = q \odot \cos(p\theta) + \mathrm{rotate\_half}(q) \odot \sin(p\theta), \quad "
             r"\mathrm{rotate\_half}(a, b) = (-b, a)")
    if wt.n_tokens > 1 and not np.any(wt.rotary_sin):  # SmolLM3 leaves the rotary embedding out of some blocks
        st.info(f"Block {layer} applies **no rotary embedding**: its queries and keys are the projections as they "
                "are, and the other blocks tell positions apart.", icon=":material/info:")
    with view_guard("rotary embedding"):
        vector_row(wt, dict(name="queries_before_rotary", title=f"q, head {head}, before", key="dec_q_before",
                            head=head, max_dims=d_head, shapes=()),
                   dict(name="queries", title=f"q, head {head}, rotated", key="dec_q_after", head=head,
                        max_dims=d_head, shapes=()))
        c3, c4 = st.columns(2)
        with c3:
            vectors(wt, "keys", f"k, key/value head {kv}, rotated", "dec_k_after", head=kv, max_dims=d_head,
                    shapes=())
        with c4:
            fig = vector_heatmap(wt.rotary_cos, wt.labels, title="cos(p·θⱼ) of each position and dimension",
                                 max_dims=d_head, reply_start=wt.reply_start)
            st.plotly_chart(fig, config=figure_config("inside_rotary_cos"), key="dec_cos")
        st.caption(f"A rotation keeps every length: the queries' norms change by at most {change:.1e} (relative). "
                   "Position 0 is not rotated at all.")
        shape_line(wt, "queries", "keys", "rotary_cos")


def _attention(wt, layer: int, head: int) -> None:
    n, kv = wt.n_tokens, int(wt.kv_heads[head])
    repeat = (f" The keys of key/value head {kv} are repeated for each head that shares it, so head {head} scores "
              f"its own queries against them." if wt.n_kv_heads < wt.n_heads else "")
    st.markdown("Scores compare every query with every key. The **causal mask** sets every score of a later key to "
                "−∞, so the softmax gives it weight exactly 0: each token sees only itself and the tokens before it, "
                "and the first token gets its row all to itself." + repeat)
    st.latex(r"\mathrm{scores} = q' k'^\top \cdot " + f"{wt.score_scale:.4g}"
             + r", \quad \mathrm{weights} = \mathrm{softmax}(\mathrm{scores} + M), \quad "
             r"M_{ij} = \begin{cases} 0 & j \le i \\ -\infty & j > i \end{cases}")
    if abs(wt.score_scale * np.sqrt(wt.d_head) - 1) > 1e-6:
        st.caption(f"This model scales scores by {wt.score_scale:.4g}, not by 1/√d_head = {1 / np.sqrt(wt.d_head):.4g}.")
    with view_guard("scores and weights"):
        hide = positions_outside_window(n, "inside_window", "scores and weights")
        c1, c2 = st.columns(2)
        limit = wt.score_limit(head)
        with c1:
            st.plotly_chart(attention_heatmap(wt.masked_scores[head], wt.labels, title="Scores after the causal mask "
                                              "(−∞ above the diagonal)", colorscale=SCORE_SCALE, hide=hide,
                                              zmin=-limit, zmax=limit, value_name="score",
                                              masked=~wt.mask, reply_start=wt.reply_start),
                            config=figure_config(f"inside_dec_scores_H{head}"), key="dec_scores")
            shape_line(wt, "masked_scores")
        with c2:
            st.plotly_chart(attention_heatmap(wt.weights[head], wt.labels, title="Weights = softmax(scores)",
                                              hide=hide, masked=~wt.mask, reply_start=wt.reply_start),
                            config=figure_config(f"inside_dec_weights_H{head}"), key="dec_weights")
            shape_line(wt, "weights")
        first = float(wt.weights[head, 1:, 0].mean()) if n > 1 else 1.0
        st.caption(f"Head {head} puts {first:.0%} of its attention, on average over the later tokens, on the first "
                   "token: many decoder heads park attention there when nothing else matches (the attention sink).")


def _output(wt, layer: int, head: int) -> None:
    d_head, hidden = wt.d_head, wt.hidden_size
    st.markdown(f"Each head mixes the values of its key/value head with its weights. The {wt.n_heads} outputs are laid "
                f"side by side (head {head} fills columns {head * d_head}–{(head + 1) * d_head - 1}) and the output "
                f"projection W_O maps them back to the stream's width, {hidden}.")
    st.latex(r"\mathrm{head}_h = \mathrm{weights}_h\, v_{\mathrm{kv}(h)}, \quad "
             r"\mathrm{Attn}(x) = \mathrm{Concat}(\mathrm{head}_0, \dots)\, W_O^\top")
    with view_guard("output projection"):
        vectors(wt, "head_outputs", f"Head {head}'s output = weights @ v", "dec_head_out", head=head, max_dims=d_head)
        vector_row(wt, dict(name="concat", title=dims_title("Concatenated heads", wt.concat.shape[-1]), key="dec_concat",
                            mark=(head * d_head, (head + 1) * d_head) if (head + 1) * d_head <= 64 else None),
                   dict(name="attention_output", title=dims_title("After W_O", hidden), key="dec_attn_out"))


def _mlp_norm(wt, layer: int, head: int) -> None:
    if wt.sandwich_norms:
        st.markdown("This model (as Gemma 2 and 3 do) normalises the attention output before adding it to the stream, "
                    "then normalises again before the MLP, and once more after it.")
        st.latex(r"x' = x + \mathrm{RMSNorm}(\mathrm{Attn}(\mathrm{RMSNorm}(x))), \qquad "
                 r"y = x' + \mathrm{RMSNorm}(\mathrm{MLP}(\mathrm{RMSNorm}(x')))")
    else:
        st.markdown("The attention output is added to the stream (the residual connection), and the sum is "
                    "normalised again before the MLP. The stream itself is never normalised inside the block "
                    "(pre-normalisation), so its norm can grow layer by layer.")
        st.latex(r"x' = x + \mathrm{Attn}(\mathrm{RMSNorm}_1(x)), \qquad y = x' + \mathrm{MLP}(\mathrm{RMSNorm}_2(x'))")
    with view_guard("residual and RMSNorm"):
        vector_row(wt, dict(name="residual_1", title=dims_title("x' = stream after attention", wt.hidden_size),
                            key="dec_res1"),
                   dict(name="ffn_input", title=dims_title("RMSNorm₂(x'), what the MLP reads", wt.hidden_size),
                        key="dec_rms2"))


def _mlp(wt, layer: int, head: int) -> None:
    act = wt.activation_name
    st.markdown(f"The **gated MLP** (SwiGLU; Shazeer, 2020) widens each token to {wt.intermediate_size} dimensions "
                f"twice: a gate, passed through {act}, multiplies an up projection element by element, and the down "
                f"projection brings the product back to {wt.hidden_size}. Every position goes through on its own.")
    st.latex(rf"\mathrm{{MLP}}(x) = W_\mathrm{{down}}\big(\mathrm{{{act}}}(W_\mathrm{{gate}}\, x) \odot "
             r"W_\mathrm{up}\, x\big)")
    with view_guard("gated MLP"):
        width = wt.intermediate_size
        vector_row(wt, dict(name="gate", title=dims_title("W_gate x", width), key="dec_gate", shapes=()),
                   dict(name="up", title=dims_title("W_up x", width), key="dec_up", shapes=()))
        vector_row(wt, dict(name="activation", title=dims_title(f"{act}(W_gate x)", width), key="dec_act", shapes=()),
                   dict(name="gated", title=dims_title(f"{act}(gate) ⊙ up", width), key="dec_gated", shapes=()))
        vectors(wt, "ffn_output", dims_title("W_down(…), the MLP's output", wt.hidden_size), "dec_mlp_out",
                shapes=("gate", "gated", "ffn_output"))


def _stream(wt, layer: int, head: int) -> None:
    st.markdown(f"The block adds two things to each token's vector: what attention gathered from earlier tokens and "
                f"what the MLP computed from the token itself. The stream leaving layer {layer} enters the next one.")
    with view_guard("residual stream"):
        st.plotly_chart(norm_lines(wt, {"x (layer input)": "layer_input", "x' = x + attention": "residual_1",
                                        "y (layer output)": "layer_output"},
                                   f"Norm of each token's vector through layer {layer}"),
                        config=figure_config(f"inside_dec_stream_L{layer}"), key="dec_stream")
        if wt.n_tokens > 2:
            norms = wt.token_norms("layer_output")
            ratio = float(norms[0] / np.median(norms[1:]))
            st.caption(f"Leaving layer {layer}, the first token's vector is {ratio:.1f}× as long as the median of the "
                       "others. In many decoders it grows far longer in the early layers and stays so: the token "
                       "that attention sinks into.")
        shape_line(wt, "layer_input", "residual_1", "layer_output")


def _next_token(wt, layer: int, head: int) -> None:
    last = markdown_text(wt.labels[-1])
    st.markdown(f"After the last block a final RMSNorm and the unembedding (a linear map to every vocabulary entry's "
                f"logit) turn the last token's vector into a distribution over the next token. Here, after "
                f"**{last}**:")
    st.latex(r"p(\text{next}) = \mathrm{softmax}\big(W_U\, \mathrm{RMSNorm}(x^{(L)}_{\text{last}})\big)")
    with view_guard("next token"):
        st.dataframe(pd.DataFrame({"next token": [shown_text(s) for s in wt.next_strings], "id": wt.next_ids,
                                   "probability": wt.next_probs}),
                     hide_index=True, column_config={"probability": st.column_config.ProgressColumn(
                         format="%.3f", min_value=0.0, max_value=1.0)})
        shape_line(wt, "final_hidden", "next_probs")
    st.page_link("pages/predictions.py", label="Every position's predictions and the logit lens",
                 icon=":material/query_stats:")


# (title, body, open at first): a closed step builds nothing (its expander reruns the walk when opened).
STEPS = (
    ("1 · BPE pieces and ids", _tokens, True),
    ("2 · Token embedding (no position embedding)", _embeddings, False),
    ("3 · Layer {layer}: RMSNorm before attention", _rmsnorm, False),
    ("4 · Layer {layer}, head {head}: queries, keys and values", _qkv, False),
    ("5 · Rotary position embedding", _rotary, False),
    ("6 · Scores, the causal mask and softmax", _attention, True),
    ("7 · Head outputs and the output projection", _output, False),
    ("8 · Residual sum and RMSNorm before the MLP", _mlp_norm, False),
    ("9 · Gated MLP (SwiGLU)", _mlp, False),
    ("10 · The residual stream through the block", _stream, False),
    ("11 · Final RMSNorm, unembedding and the next token", _next_token, False),
)
