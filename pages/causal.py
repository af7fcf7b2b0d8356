"""Causal mask and masked scores: scores -> mask -> masked scores -> weights, bidirectional beside causal.

One forward pass: the model's own steps come from the trace, and the other variant (the causal mask on a
bidirectional model, no mask on a causal one) is derived from the same head's real queries and keys
(``model_core.analysis.mask_steps``), so the page costs no second run of the model.
"""

import math

import streamlit as st

from model_core.io.tables import token_matrix_to_csv
from model_core.analysis.mask_steps import MaskSteps, mask_steps, window_steps
from ui.analysis_widgets import positions_outside_window
from ui.context import require_trace
from attention_explorer.figures import SCORE_SCALE, attention_heatmap
from ui.downloads import figure_config
from ui.guard import view_guard
from ui.state import head_fragment


ctx = require_trace(compact=True)
long = ctx.compact is not None  # a long input: every panel is one exact window of its compact trace
t = ctx.compact if long else ctx.trace
# Tokens a panel shows at a time, of a full trace or of a long input's compact one. Six panels redraw on every head
# change: at 128 tokens (3 px cells) a SmolLM2 head change took 0.44-0.63 s, at 64 (6 px cells) 0.36-0.48 s.
WINDOW = 64
st.title("Causal mask & masked scores")

model = t.family.label  # "chapter-3 encoder", "BERT-like encoder", "GPT-2 decoder", "Llama-like decoder"
if t.causal:
    # (title, apply_causal): the model's own causal steps, and the same scores without the mask.
    variants = [(f"Bidirectional — derived from this {model}'s scores", False),
                (f"Causal (the {model}'s own mask)", None)]
    note = (f"This {model} runs with a causal mask: the right-hand row is the model's own numbers. The left-hand "
            "row takes the same head's real queries and keys and applies the softmax without the mask, to show "
            "what the mask changes; the model never computes it. In layer 0 it is exactly what the model would "
            "compute with the mask off; from layer 1 on the model's inputs would differ too, because its earlier "
            "layers were masked.")
else:
    variants = [(f"Bidirectional (what this {model} does)", None), ("Causal — derived from its scores", True)]
    note = (f"This {model} is bidirectional: it uses no causal mask. The causal row applies `np.tril` to this "
            "head's real scores to show what the mask would do; it is an illustration, not the model's behaviour. "
            "In layer 0 it is exactly what the model would compute with the mask on; from layer 1 on its inputs "
            "would differ too.")

tokens, b = t.labels, t.sentence_b_start
height = 360 if t.n_tokens <= 32 else 520
# Most models scale by 1/√d_head; a few (Gemma: query_pre_attn_scalar) scale otherwise.
SCALE = ("QKᵀ/√d" if math.isclose(t.score_scale, t.d_head ** -0.5, rel_tol=1e-4)
         else f"QKᵀ·{t.score_scale:.4g}")
MASK_NAME = "the model's own causal mask" if t.is_decoder else "`np.tril`"
STEP_TITLES = [f"1 · scores {SCALE}", "2 · mask", "3 · masked scores (−∞ where masked)", "4 · softmax weights"]


def panel(step: int, steps: MaskSteps, hide: list[int], labels: tuple[str, ...] | None = None,
          reply: int | None = None):
    """The figure of one step of one variant (positions in ``hide`` left out, nothing renormalised); ``labels``
    are the shown tokens when the steps are a window of a long input; ``reply`` where a generated reply starts
    among them (dashed teal), or None."""
    lim = float(abs(steps.scores).max()) or 1.0
    if step == 0:
        matrix, style = steps.scores, dict(colorscale=SCORE_SCALE, zmin=-lim, zmax=lim, value_name="score")
    elif step == 1:
        matrix = steps.mask.astype(float)
        style = dict(colorscale=[[0, "#f4f4f4"], [1, "#4c78a8"]], zmin=0, zmax=1, value_name="mask (1 = may attend)")
    elif step == 2:
        matrix, style = steps.masked_scores, dict(colorscale=SCORE_SCALE, zmin=-lim, zmax=lim, value_name="masked score")
    else:
        matrix, style = steps.weights, dict(zmin=0, zmax=1, value_name="weight")
    fig = attention_heatmap(matrix, tokens if labels is None else labels, sentence_b_start=b, height=height, hide=hide,
                            reply_start=reply, **style)
    fig.update_layout(xaxis_title=None, yaxis_title=None, showlegend=False)
    return fig


def why_these_steps(s: MaskSteps) -> str:
    """The explanation under the panels, with this head's numbers."""
    scale_note = ("" if SCALE == "QKᵀ/√d" else
                  f" (this model scales by {t.score_scale:.4g} instead of 1/√d = {t.d_head ** -0.5:.4g})")
    rotary_note = ("" if not t.is_decoder else
                   "\n\nThe queries and keys are the ones the model multiplies: after its position encoding (the "
                   "rotary embedding, in a Llama-like model)"
                   + (f", and each key is its key/value head's: {t.n_heads} query heads share {t.n_kv_heads}."
                      if t.n_kv_heads < t.n_heads else "."))
    mask_source = ("the model's own mask, as `transformers` builds it" if t.is_decoder else
                   "`np.tril` here, `torch.tril` in the encoder")
    return f"""
**Why divide by √d.** A query and a key are vectors of d = {t.d_head} numbers. If their entries have
unit variance, their dot product has variance d, so raw scores grow with the head size and the softmax
saturates into a near one-hot row whose gradients vanish. Dividing by √d = {t.d_head ** 0.5:.2f} brings the
variance back to about 1{scale_note}. In this head, the raw dot products have a standard deviation of
**{s.unscaled_std:.2f}**; after scaling, **{s.scaled_std:.2f}**.{rotary_note}

**Why −∞ gives exactly 0.** The softmax computes exp(score) / Σ exp(scores). With
`masked_fill(mask == 0, -inf)`, a masked score becomes −∞ and exp(−∞) = 0 exactly, so a masked key
gets no weight at all, and the remaining weights still sum to 1. A large finite negative number (say −10⁴)
would only make the weight small, never zero. Every row keeps at least one unmasked key (itself, on the
diagonal), so no row is all −∞.

**Reading the panels.** Row *i* is query token *i*; column *j* is key token *j*. The causal mask
({mask_source}) keeps the lower triangle: token *i* may attend to tokens
0…*i* only, as in a decoder that must not see the future.
"""


def _steps(layer: int, head: int) -> None:
    """Every panel, caption and download of one head; reruns alone when the layer or head changes."""
    st.caption(f"{t.description} · layer {layer}, head {head} · {t.n_tokens} tokens")
    st.info(note)
    if t.n_kv_heads < t.n_heads:
        st.caption(ctx.kv_sharing(head) + " Its keys are the same as theirs; only the queries differ.")
    if long:
        size = min(WINDOW, t.n_tokens // 2)  # a long input has far more; a window always has room to move
        lo = st.slider(f"First token shown ({size} at a time)", 0, t.n_tokens - size, t.n_tokens - size,
                       key="causal_long_window")
        st.caption(f"Tokens {lo}–{lo + size - 1} of {t.n_tokens:,}, computed exactly from the compact trace's queries, "
                   "keys and row log-sum-exps. The model's own weights are over the whole input, so in this window a "
                   "row sums to 1 only with the keys before it; the bidirectional row's softmax runs over every key.")
        rows = [(title, window_steps(t, layer, head, lo, size, apply)) for title, apply in variants]
        hide, labels, raw = [], t.labels[lo:lo + size], t.tokens[lo:lo + size]
        reply = None if t.reply_start is None else t.reply_start - lo  # the window's own positions
    else:
        rows = [(title, mask_steps(t, layer, head, apply_causal=apply)) for title, apply in variants]
        hide = positions_outside_window(t.n_tokens, "causal_window", size=WINDOW)
        labels, raw = tokens, t.tokens
        reply = t.reply_start  # the steps are in pieces even with words on
    headers = st.columns(2)
    for col, (title, steps) in zip(headers, rows):
        col.markdown(f"#### {title}")
        if steps.illustrative:
            col.caption("Derived here from the head's real scores with a mask the model did not use."
                        if steps.causal else
                        "Derived here from the head's real scores without the model's mask: not the model's numbers.")
    for step, step_title in enumerate(STEP_TITLES):
        st.markdown(f"**{step_title}**" + (f" — {MASK_NAME}: 1 on and below the diagonal" if step == 1 else ""))
        cols = st.columns(2)
        if step == 0:
            # Both rows start from the same q·k: the mask acts only after this step. One panel, not two copies.
            with cols[0], view_guard(step_title):
                st.plotly_chart(panel(0, rows[0][1], hide, labels, reply), config=figure_config("causal_step0_scores"), key="step0")
            cols[1].info("The scores are the same for both rows: the same queries and keys, multiplied before any "
                         "mask. The mask acts only from the next step on, so this panel stands for both.",
                         icon=":material/equal:")
            continue
        for i, (col, (title, steps)) in enumerate(zip(cols, rows)):
            if step == 2 and steps.mask.all():
                # Nothing masked: these masked scores are step 1's scores, drawn once above (one figure fewer to
                # send and draw on every head change).
                col.info("Nothing is masked in this row, so its masked scores are the scores of step 1, cell for "
                         "cell: no −∞ anywhere. The softmax below runs over every key.", icon=":material/equal:")
                continue
            with col, view_guard(f"{step_title} ({'causal' if steps.causal else 'bidirectional'})"):
                st.plotly_chart(panel(step, steps, hide, labels, reply), config=figure_config(f"causal_step{step}_{'causal' if steps.causal else 'bidirectional'}"),
                                key=f"step{step}_row{i}")
    if ctx.words is not None:
        st.markdown(f"**5 · weights merged into words** — the mask and the scores act on {ctx.pieces}, so steps "
                    f"1–4 stay in pieces; here each row is a word. {ctx.words_note()}")
        cols = st.columns(2)
        for i, (col, (title, steps)) in enumerate(zip(cols, rows)):
            merged, words, word_b = ctx.shown(steps.weights)
            word_hide = positions_outside_window(len(words), f"causal_word_window{i}", "merged weights", size=WINDOW)
            with col, view_guard(f"weights in words ({'causal' if steps.causal else 'bidirectional'})"):
                fig = attention_heatmap(merged, words, sentence_b_start=word_b, height=height, hide=word_hide,
                                        zmin=0, zmax=1, value_name="weight", reply_start=ctx.reply_start())
                fig.update_layout(xaxis_title=None, yaxis_title=None, showlegend=False)
                st.plotly_chart(fig, config=figure_config(f"causal_words_row{i}"), key=f"words_row{i}")
    cols = st.columns(2)
    for i, (col, (title, steps)) in enumerate(zip(cols, rows)):
        masked_cells = int((~steps.mask).sum())
        zero = int((steps.weights[~steps.mask] == 0).sum())
        col.caption(f"{masked_cells} masked cells; {zero} of them have weight exactly 0 after the softmax. "
                    "Dark cells (−∞) are masked, not a value of the colour scale.")
        kind = "causal" if steps.causal else "bidirectional"
        col.download_button(f"Masked scores, {kind} (CSV)",
                            # Not the steps: their weights are a view of the trace's, which would stay alive.
                            data=lambda m=steps.masked_scores: token_matrix_to_csv(m, raw, raw),
                            file_name=f"masked_scores_L{layer}_H{head}_{kind}.csv", mime="text/csv",
                            on_click="ignore", key=f"csv_{i}")

    st.markdown("### Why these steps")
    st.markdown(why_these_steps(rows[0][1]))


head_fragment("causal_head", _steps, slot=ctx.head_slot, n_layers=t.n_layers, n_heads=t.n_heads,
              settings=ctx.settings)
