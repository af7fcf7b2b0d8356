"""The rollout page for a long input in compact form: attention rollout into one token, each layer's head mean
recomputed in blocks from the queries, keys and log-sum-exps (``model_core.compact.views.rollout_row``), on
request and with a progress bar."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from model_core.analysis import FLOW_MAX_TOKENS_ONE_ROW
from model_core.compact.trace import CompactTrace
from model_core.compact.views import rollout_row
from model_core.io.tables import matrix_to_csv, position_labels
from ui.compact_figures import relevance_line_figure
from ui.context import AppContext
from ui.downloads import figure_config
from ui.trace_cache import per_trace

TOP = 20


@per_trace()
def _rollout_row(trace: CompactTrace, target: int) -> np.ndarray:
    """The relevance row into ``target``, with a progress bar, once per (trace, target) for every session."""
    bar = st.progress(0.0, text="Rollout: 0 layers of the head means applied")

    def progress(done: float) -> None:
        bar.progress(done, text=f"Rollout: {round(done * trace.n_layers)} of {trace.n_layers} layers applied")

    row = rollout_row(trace, target, progress=progress)
    bar.empty()
    row.setflags(write=False)
    return row


def draw(ctx: AppContext) -> None:
    """The rollout page for ``ctx.compact``: pick the token, compute its row, then the line, top tokens and CSV."""
    t = ctx.compact
    st.caption(f"{t.description} · {t.n_tokens:,} tokens · compact form · {t.dtype}")
    st.info(f"**Compact form.** Rollout into one token is computed from each layer's head mean, recomputed in "
            f"blocks of rows from the queries, keys and log-sum-exps: no {t.n_tokens:,}² matrix is held. The "
            f"full rollout matrix and attention flow need every weight (flow solves a max-flow problem per token "
            f"pair: up to {FLOW_MAX_TOKENS_ONE_ROW} tokens for one row), so they are drawn for short inputs only.",
            icon=":material/compress:")
    default = t.n_tokens - 1
    target = int(st.number_input("Rollout into the token at position", 0, t.n_tokens - 1, default, step=1,
                                 key="compact_rollout_target",
                                 help="The last token by default: the one that predicts the next token."))
    word = t.labels[target].lstrip("␣") or t.labels[target]
    computed = _rollout_row.cached(t, target)
    if not computed:
        ask = st.empty()  # the note and button, cleared once the row is computed (not left over in that run)
        with ask.container():
            st.caption(f"Each of the {t.n_layers} layers recomputes every head's weights in blocks: tens of seconds "
                       "at 4,096 tokens on a CPU.")
            clicked = st.button(f"Compute rollout into “{word}” (position {target})", type="primary",
                                key="compact_rollout_run", icon=":material/play_arrow:")
        if not clicked:
            return
    row = _rollout_row(t, target)
    if not computed:
        ask.empty()
    name = f"rollout_into_{target}"
    st.plotly_chart(relevance_line_figure(row, t.labels, f"Relevance of each token to “{word}” "
                                          f"(position {target}), after the last layer", reply_start=t.reply_start),
                    config=figure_config(name), key="compact_rollout_line")
    if t.is_decoder:
        st.caption(f"Over many layers a decoder's rollout piles up on the first token ({row[0]:.1%} here): every "
                   "layer sends much of its attention to that sink, and the products compound.")
    top = np.argsort(-row)[:TOP]
    st.dataframe(pd.DataFrame({"position": top, "token": [t.labels[i] for i in top], "share": row[top]}),
                 hide_index=True, height=min(36 * (TOP + 1), 400),
                 column_config={"share": st.column_config.NumberColumn(format="%.3e")})
    st.download_button("Relevance of every token (CSV)",
                       lambda: matrix_to_csv(row[:, None], position_labels(t.tokens), ["rollout"]),
                       file_name=f"{name}.csv", mime="text/csv", on_click="ignore", key="compact_rollout_csv")
