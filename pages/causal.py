"""Causal mask and masked scores: scores -> mask -> masked scores -> weights, bidirectional beside causal."""

from dataclasses import replace

import streamlit as st

from model_core.tables import token_matrix_to_csv
from model_core.mask_steps import MaskSteps, mask_steps
from model_core.words import RULE
from ui.analysis_widgets import token_window
from ui.context import require_trace
from ui.figures import PLOTLY_CONFIG, SCORE_SCALE, attention_heatmap
from ui.guard import view_guard
from ui.loaders import get_trace
from ui.state import head_fragment


ctx = require_trace()
t = ctx.trace
st.title("Causal mask & masked scores")

if t.model_kind == "custom":
    with st.spinner("Running the other variant of the model…"):
        other = get_trace(replace(ctx.request, causal=not t.causal))
    bidirectional, causal = (other, t) if t.causal else (t, other)
    variants = [("Bidirectional (the model with causal off)", bidirectional, None),
                ("Causal (the model with causal on)", causal, None)]
    note = ("The custom encoder really runs with or without the causal mask: both rows are the model's own "
            "numbers. (From layer 1 on the inputs differ too, because the causal model's earlier layers "
            "were masked.)")
else:
    variants = [("Bidirectional (what BERT does)", t, None), ("Causal — an illustration", t, True)]
    note = ("BERT is bidirectional: it never uses a causal mask. The causal row applies `np.tril` to this "
            "head's real scores to show what the mask would do; it is an illustration, not BERT's behaviour.")

tokens, b = t.tokens, t.sentence_b_start
height = 360 if t.n_tokens <= 32 else 520
STEP_TITLES = ["1 · scores QKᵀ/√d", "2 · mask", "3 · masked scores (−∞ where masked)", "4 · softmax weights"]


def panel(step: int, steps: MaskSteps, hide: list[int]):
    """The figure of one step of one variant (positions in ``hide`` left out, nothing renormalised)."""
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
    fig = attention_heatmap(matrix, tokens, sentence_b_start=b, height=height, hide=hide, **style)
    fig.update_layout(xaxis_title=None, yaxis_title=None, showlegend=False)
    return fig


def why_these_steps(s: MaskSteps) -> str:
    """The explanation under the panels, with this head's numbers."""
    return f"""
**Why divide by √d.** A query and a key are vectors of d = {t.d_head} numbers. If their entries have
unit variance, their dot product has variance d, so raw scores grow with the head size and the softmax
saturates into a near one-hot row whose gradients vanish. Dividing by √d = {t.d_head ** 0.5:.2f} brings the
variance back to about 1. In this head, the raw dot products have a standard deviation of
**{s.unscaled_std:.2f}**; after scaling, **{s.scaled_std:.2f}**.

**Why −∞ gives exactly 0.** The softmax computes exp(score) / Σ exp(scores). With
`masked_fill(mask == 0, -inf)`, a masked score becomes −∞ and exp(−∞) = 0 exactly, so a masked key
gets no weight at all, and the remaining weights still sum to 1. A large finite negative number (say −10⁴)
would only make the weight small, never zero. Every row keeps at least one unmasked key (itself, on the
diagonal), so no row is all −∞.

**Reading the panels.** Row *i* is query token *i*; column *j* is key token *j*. The causal mask
(`np.tril` here, `torch.tril` in the encoder) keeps the lower triangle: token *i* may attend to tokens
0…*i* only, as in a decoder that must not see the future.
"""


def _steps(layer: int, head: int) -> None:
    """Every panel, caption and download of one head; reruns alone when the layer or head changes."""
    st.caption(f"{t.description} · layer {layer}, head {head} · {t.n_tokens} tokens")
    st.info(note)
    rows = [(title, mask_steps(trace, layer, head, apply_causal=apply)) for title, trace, apply in variants]
    hide = token_window(t.n_tokens, "causal_window")  # 8 panels of 512 x 512 took 2 s per head
    headers = st.columns(2)
    for col, (title, steps) in zip(headers, rows):
        col.markdown(f"#### {title}")
        if steps.illustrative:
            col.caption("This model did not use the mask: it is applied here to the head's real scores.")
    for step, step_title in enumerate(STEP_TITLES):
        st.markdown(f"**{step_title}**" + (" — `np.tril`: 1 on and below the diagonal" if step == 1 else ""))
        cols = st.columns(2)
        for i, (col, (title, steps)) in enumerate(zip(cols, rows)):
            with col, view_guard(f"{step_title} ({'causal' if steps.causal else 'bidirectional'})"):
                st.plotly_chart(panel(step, steps, hide), config=PLOTLY_CONFIG, key=f"step{step}_row{i}")
    if ctx.words is not None:
        st.markdown("**5 · weights merged into words** — the mask and the scores act on WordPieces, so steps 1–4 "
                    f"stay in pieces; here each row is a word: {RULE}")
        cols = st.columns(2)
        for i, (col, (title, steps)) in enumerate(zip(cols, rows)):
            merged, words, word_b = ctx.shown(steps.weights)
            word_hide = token_window(len(words), f"causal_word_window{i}", "merged weights")
            with col, view_guard(f"weights in words ({'causal' if steps.causal else 'bidirectional'})"):
                fig = attention_heatmap(merged, words, sentence_b_start=word_b, height=height, hide=word_hide,
                                        zmin=0, zmax=1, value_name="weight")
                fig.update_layout(xaxis_title=None, yaxis_title=None, showlegend=False)
                st.plotly_chart(fig, config=PLOTLY_CONFIG, key=f"words_row{i}")
    cols = st.columns(2)
    for i, (col, (title, steps)) in enumerate(zip(cols, rows)):
        masked_cells = int((~steps.mask).sum())
        zero = int((steps.weights[~steps.mask] == 0).sum())
        col.caption(f"{masked_cells} masked cells; {zero} of them have weight exactly 0 after the softmax. "
                    "Dark cells (−∞) are masked, not a value of the colour scale.")
        kind = "causal" if steps.causal else "bidirectional"
        col.download_button(f"Masked scores, {kind} (CSV)",
                            data=lambda s=steps: token_matrix_to_csv(s.masked_scores, tokens, tokens),
                            file_name=f"masked_scores_L{layer}_H{head}_{kind}.csv", mime="text/csv",
                            on_click="ignore", key=f"csv_{i}")

    st.markdown("### Why these steps")
    st.markdown(why_these_steps(rows[0][1]))


head_fragment("causal_head", _steps, slot=ctx.head_slot, n_layers=t.n_layers, n_heads=t.n_heads,
              settings=ctx.settings)
