"""The direct logit attribution page's parts: the answer and foil from the page's fields, the cached attribution, the
top heads with their "Open in heatmaps" buttons, and one head's effect drawn over the text."""

from __future__ import annotations

from typing import Any

import numpy as np
import streamlit as st

from attention_explorer.attribution import sources_bars, sources_html
from model_core.compact.trace import CompactTrace
from model_core.effects.attribution import Attribution, attribute, token_id_of, top_two
from model_core.effects.attribution_long import (
    LastPosition,
    attribute_last,
    last_position_pass,
)
from model_core.trace.trace import AttentionTrace
from ui.analysis_widgets import clicked_cell, show_figure
from ui.fields import PAGE_PARAMS
from ui.focus import set_focus
from ui.loaders import get_pretrained
from ui.trace_cache import per_trace

OPEN_FLAG = "_dla_open_heatmaps"
SPLIT_KEY = PAGE_PARAMS["dla_head"][0]  # the link carries the split head (-1: the strongest)
TOP = 5  # heads listed each way
BARS_FROM = 128  # past this many tokens the split is also drawn as bars (the text wraps over many lines)


@per_trace(spinner="Splitting the logit into each component's direct effect…")
def cached_attribution(trace: AttentionTrace, model_id: str, device_name: str, answer_id: int,
                       foil_id: int | None) -> Attribution:
    """``model_core.effects.attribution.attribute`` at the last token, once per (trace, answer, foil), with the cached
    model the trace came from."""
    loaded = get_pretrained(model_id, device_name)
    return attribute(trace, loaded.model, loaded.family, answer_id, foil_id)


@per_trace(spinner="Running the model once more for the last token's z and residual stream…")
def cached_last_pass(compact: CompactTrace, model_id: str, device_name: str) -> LastPosition:
    """``model_core.effects.attribution_long.last_position_pass`` of a long input: one more pass through the route,
    once per compact trace."""
    loaded = get_pretrained(model_id, device_name)
    return last_position_pass(loaded.family, loaded.model, compact.token_ids)


@per_trace()
def cached_long_attribution(compact: CompactTrace, model_id: str, device_name: str, answer_id: int,
                            foil_id: int | None) -> Attribution:
    """``attribute_last`` of a long input's compact trace, from its one extra pass (``cached_last_pass``)."""
    loaded = get_pretrained(model_id, device_name)
    last = cached_last_pass(compact, model_id, device_name)
    return attribute_last(loaded.family, loaded.model, compact.token_ids, compact.tokens, answer_id, foil_id,
                          last=last)


def top_ids(trace: AttentionTrace | CompactTrace, model_id: str, device_name: str) -> tuple[int, int]:
    """The model's top prediction and runner-up after the last token (a compact trace without predictions: from the
    extra pass)."""
    if trace.next_token_ids is not None:
        return top_two(trace)
    ids = cached_last_pass(trace, model_id, device_name).top_ids
    return int(ids[0]), int(ids[1])


def choose_tokens(tokenizer: Any, top: tuple[int, int], answer: str, foil: str,
                  no_foil: bool) -> tuple[int, int | None]:
    """The answer and foil ids from the page's fields: "" is the top prediction, and for the foil the runner-up (the
    top prediction when the answer is the runner-up); ``no_foil`` splits the logit itself.

    Raises:
        NotOneToken: a field is several tokens; its ``pieces`` list them.
    """
    first, second = top
    answer_id = token_id_of(tokenizer, answer, "answer") if answer else first
    if no_foil:
        return answer_id, None
    if foil:
        return answer_id, token_id_of(tokenizer, foil, "foil")
    return answer_id, second if second != answer_id else first


def _open(layer: int, head: int) -> None:
    set_focus(layer, head)
    st.session_state[OPEN_FLAG] = True  # the page switches at its top, on the run this click starts


def top_heads_table(attribution: Attribution) -> None:
    """The heads that push hardest towards the answer and against it, each with a button to its heatmap."""
    left, right = st.columns(2)
    for column, sign, title in ((left, 1, "Towards the answer"), (right, -1, "Against it")):
        with column:
            st.markdown(f"**{title}**")
            heads = attribution.top_heads(TOP, sign)
            if not heads:
                st.caption("No head.")
            for layer, head, effect in heads:
                text, button = st.columns([3, 2])
                text.markdown(f"Layer {layer}, head {head}: **{effect:+.3f}**")
                button.button("Open in heatmaps", key=f"dla_open_{layer}_{head}", on_click=_open, args=(layer, head),
                              help="Focus this head and open its attention heatmap.")


def head_options(attribution: Attribution) -> list[int]:
    """Every head as layer * n_heads + head, the strongest effect (either sign) first."""
    return [int(i) for i in np.argsort(-np.abs(attribution.heads).ravel(), kind="stable")]


def split_view(attribution: Attribution, trace: AttentionTrace, text: tuple[str, ...], label: str) -> np.ndarray:
    """One head's effect over its source tokens, drawn over the text (and as bars for a long text); returns it."""
    n_heads = attribution.n_heads
    options = head_options(attribution)
    if st.session_state.get(SPLIT_KEY) not in options:
        st.session_state[SPLIT_KEY] = options[0]
    flat = st.selectbox("Head", options, key=SPLIT_KEY,
                        format_func=lambda i: f"layer {i // n_heads}, head {i % n_heads} "
                                              f"({attribution.heads.ravel()[i]:+.3f})",
                        help="Heads are listed by the size of their effect; a click on the grid picks one too.")
    layer, head = divmod(int(flat), n_heads)
    split = attribution.sources(trace, layer, head)
    strongest = int(np.abs(split).argmax())
    st.caption(f"Layer {layer}, head {head} moves {label} by **{attribution.heads[layer, head]:+.4f}**; each token "
               f"is shaded by the part of that which the head moved from it (αᵢⱼ·vⱼ·W_O through the frozen norms onto "
               f"the unembedding): red towards the answer, blue against. The largest comes from token {strongest} "
               f"({text[strongest]!r}, {split[strongest]:+.4f}); the read position is outlined.")
    st.markdown(sources_html(split, text, position=attribution.position), unsafe_allow_html=True)
    if len(text) > BARS_FROM:
        show_figure(sources_bars(split, text, title=f"Layer {layer}, head {head}: effect by source token"),
                    f"dla_sources_L{layer}H{head}", key="dla_sources_bars")
    return split


def pick_clicked(chart_key: str, n_heads: int) -> None:
    """A click on the grid picks that head for the split and focuses it (a callback: it runs before the page)."""
    cell = clicked_cell(chart_key)
    if cell is not None:
        st.session_state[SPLIT_KEY] = cell[0] * n_heads + cell[1]
        set_focus(*cell)
