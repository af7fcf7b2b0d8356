"""Generate: ask the sidebar's decoder something, read the reply as it streams, then step through it: what each new
token attended to, drawn on the text, and the candidates the model weighed. The whole sequence is traced once, so
every page can open it, with the reply's start marked."""

import streamlit as st

from model_core.generate.generation import has_chat_template
from ui.context import get_context
from ui.generate import (
    controls,
    current_result,
    decoder_or_stop,
    GRAPH_FLAG,
    generate_button,
    graph_button,
    open_everywhere,
    reader,
    run_job,
    show_reply,
    trace_of,
)
from ui.guard import view_guard
from ui.state import open_page_if_requested

open_page_if_requested(GRAPH_FLAG, "pages/contributions.py")  # "Contribution graph of this token" was pressed
ctx = get_context()
st.title("Generate")
loaded, model_id = decoder_or_stop(ctx)
has_template = has_chat_template(loaded.tokenizer)
st.caption(f"{loaded.description} · greedy by default; each new token is one pass through the model on its "
           "key/value cache.")
controls(has_template)
generate_button(model_id, has_template)
job = st.session_state.get("_gen_job")
streaming = job is not None and not job["started"]  # this run streams the reply (it shows as it comes)
run_job(loaded, ctx.settings)
result = current_result(model_id)
if result is None:
    if not streaming:
        st.info("Write a prompt and press **Generate**: the reply streams here, then the whole sequence is traced and "
                "you can step through what each new token attended to.", icon=":material/chat:")
    st.stop()
show_reply(result, streamed=streaming)
if result.n_new == 0:
    st.info("Stopped before the first token: nothing to trace. Press Generate again.")
    st.stop()

st.subheader("The whole sequence, traced")
request = result.request(model_id)
try:
    sequence = trace_of(request)
except ValueError as exc:  # InputError and ModelLoadError are ValueErrors
    st.error(str(exc), icon=":material/error:")
    st.stop()
if sequence is None:  # the compact trace was cancelled
    st.stop()
st.caption(f"{sequence.n_tokens} tokens ({'compact form' if hasattr(sequence, 'lse') else 'full trace'}), exactly "
           "what teacher forcing the prompt and reply gives; the reply starts at position "
           f"{result.reply_start}.")
open_everywhere(request, model_id, ctx.request)

st.subheader("Step through the reply")
with view_guard("reply reader"):
    chosen = reader(result, sequence, loaded.tokenizer, ctx.focus)
    graph_button(request, model_id, chosen)
