"""The Generate page's parts: the prompt and decoding controls, streaming a reply with a Stop button, the whole
sequence's trace (the app's one trace cache, so every page can open it) and the reader that steps through the reply.

Stopping works as the queue's "Leave the queue" does: a click reruns the script, which ends the streaming run at its
next Streamlit call. The steps are kept in the session as they come, so the rerun keeps what was generated and traces
it (``JOB`` "started" and no result: the run was cut short).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pandas as pd
import streamlit as st

from attention_explorer.generation import attention_text_html, token_texts
from model_core.generate.generation import (
    DecodingOptions,
    Generation,
    assemble,
    start_generation,
)
from model_core.generate.reading import HOW_LABELS, writing_attention
from model_core.settings import BUNDLED_DECODER_ID
from model_core.trace.request import TraceRequest
from model_core.trace.resolve import model_id_of
from ui.fields import request_state
from ui.loaders import all_cores_for_generation
from ui.state import choose_model

JOB, PARTIAL, RESULT, ERROR = "_gen_job", "_gen_partial", "_gen_result", "_gen_error"
STEP, HOW, LAYER, HEAD = "gen_step", "gen_how", "gen_layer", "gen_head"
STREAM_EVERY_S = 0.1
"""The reply is redrawn at most this often while it streams (a few tokens at a time at 15 tokens/s): each redraw
sends the whole reply to the browser, whose work shares the server's cores on a small machine."""
ENCODER_MESSAGE = ("An encoder (BERT, MiniLM, the chapter-3 encoder) reads a whole text at once, every token seeing "
                   "every other; it has no next-token head and writes nothing. Generation needs a decoder language "
                   "model, which writes one token at a time, each seeing only the tokens before it.")
OPEN_PAGES = (("pages/heatmaps.py", "Attention heatmaps", ":material/grid_view:"),
              ("pages/predictions.py", "What the model predicts", ":material/lightbulb:"),
              ("pages/analysis_rollout.py", "Rollout & flow", ":material/waves:"))
_MARKDOWN_ACTIVE = re.compile(r"[\\`*_\[\]<>$~|:@&#]")


def _as_text(chunk: str) -> str:
    """A chunk of the reply as plain text in Markdown: st.write_stream renders Markdown, and a model's reply must
    not draw links, images or LaTeX (an image would fetch from outside the app)."""
    escaped = _MARKDOWN_ACTIVE.sub(lambda m: f"&#{ord(m.group())};", chunk)
    return escaped.replace("\n", "  \n")


def _use_decoder() -> None:
    st.session_state["ctl_model"] = "pretrained"
    choose_model(BUNDLED_DECODER_ID)


def decoder_or_stop(ctx: Any) -> tuple[Any, str]:
    """The sidebar's model, loaded (the app's cached copy), and its id; or stop the page with why an encoder does
    not generate and a button to use the bundled decoder."""
    from ui.loaders import pretrained_for

    request = ctx.request
    if request is None:
        st.info(ctx.error or "Pick a model in the sidebar.")
        st.stop()
    loaded = pretrained_for(request, ctx.settings) if request.model == "pretrained" else None
    if loaded is None or not loaded.family.is_decoder:
        st.info(ENCODER_MESSAGE, icon=":material/info:")
        st.button("Use the bundled decoder, SmolLM2-135M-Instruct", on_click=_use_decoder, type="primary",
                  key="gen_use_decoder")
        st.stop()
    return loaded, model_id_of(request, ctx.settings)


def controls(has_template: bool) -> None:
    """The prompt, the chat toggle, the token budget and the sampling settings (the ``pg_*`` keys links carry)."""
    s = st.session_state
    st.text_area("Prompt", key="pg_prompt", height=110,
                 placeholder="Ask something, or write the start of a text.")
    c1, c2, c3 = st.columns([1, 1, 1])
    c1.toggle("Chat template", key="pg_chat", disabled=not has_template,
              help="Wrap the prompt in the model's chat template as the user's message, the assistant's turn opened "
                   "(on for an Instruct model)." if has_template else "This tokenizer has no chat template.")
    c2.number_input("Max new tokens", 1, 1024, step=1, key="pg_max_new")
    c3.toggle("Sample", key="pg_sampling", help="Off: greedy, the most likely token each time (as transformers' "
                                                "generate(do_sample=False)). On: sample with the settings below.")
    if s.get("pg_sampling"):
        c1, c2, c3 = st.columns(3)
        c1.number_input("Temperature", 0.01, 5.0, step=0.05, key="pg_temperature",
                        help="Divides the logits: below 1 sharper, above 1 flatter.")
        c2.number_input("Top-p", 0.01, 1.0, step=0.05, key="pg_top_p",
                        help="Sample from the most likely tokens whose probabilities reach this share.")
        c3.number_input("Seed", 0, 2**31 - 1, step=1, key="pg_gen_seed", help="The same seed gives the same reply.")


def _start(model_id: str, has_template: bool) -> None:
    """The Generate button: read the settings into a job (the run that follows streams it)."""
    s = st.session_state
    s.pop(ERROR, None)
    sampling = bool(s.get("pg_sampling"))
    try:
        options = DecodingOptions(max_new_tokens=int(s["pg_max_new"]), sample=sampling,
                                  temperature=float(s["pg_temperature"]) if sampling else 1.0,
                                  top_p=float(s["pg_top_p"]) if sampling else 1.0,
                                  seed=int(s["pg_gen_seed"]) if sampling else 0)
    except ValueError as exc:
        s[ERROR] = str(exc)
        return
    s[JOB] = {"model_id": model_id, "prompt": s.get("pg_prompt") or "", "chat": bool(s.get("pg_chat")) and has_template,
              "options": options, "started": False}
    s.pop(RESULT, None)


def _stop() -> None:
    """The Stop button: its click reruns the script, which ends the streaming run; the rerun keeps the steps."""


def generate_button(model_id: str, has_template: bool) -> None:
    st.button("Generate", type="primary", on_click=_start, args=(model_id, has_template), key="gen_go",
              icon=":material/play_arrow:")
    if st.session_state.get(ERROR):
        st.error(st.session_state[ERROR], icon=":material/error:")


def run_job(loaded: Any, settings: Any) -> None:
    """Stream the pending job's reply (or finish one a rerun cut short) into ``RESULT``."""
    s = st.session_state
    job = s.get(JOB)
    if job is None:
        return
    tok = loaded.tokenizer
    if job["started"]:  # Stop (or another click) ended the streaming run: keep what it generated
        steps = s.get(PARTIAL) or []
        result = assemble(tok, job["prompt_ids"], steps, "stopped", chat=job["chat"], options=job["options"])
    else:
        job["started"] = True
        try:
            stream = start_generation(loaded, job["prompt"], chat=job["chat"], options=job["options"],
                                      settings=settings)
        except ValueError as exc:  # an empty prompt, no room left: said here, the page keeps working
            s.pop(JOB, None)
            st.error(str(exc), icon=":material/error:")
            return
        job["prompt_ids"] = stream.prompt
        s[PARTIAL] = stream.steps  # the same list, filled as the tokens come
        stop = st.empty()
        stop.button("Stop", key="gen_stop", on_click=_stop, icon=":material/stop:")
        with st.container(key="gen_reply"), all_cores_for_generation():  # the benches time the first token by
            st.write_stream(_as_text(chunk) for chunk in stream.text_chunks(STREAM_EVERY_S))  # this container's text
        stop.empty()
        result = stream.result()
    s.pop(JOB, None)
    s.pop(PARTIAL, None)
    s[RESULT] = {"model_id": job["model_id"], "generation": result}


def current_result(model_id: str) -> Generation | None:
    """The last generation with the sidebar's model, or None."""
    record = st.session_state.get(RESULT)
    return record["generation"] if record is not None and record["model_id"] == model_id else None


def show_reply(result: Generation, streamed: bool) -> None:
    """The reply (unless it was just streamed) and how it ended."""
    if not streamed:
        st.markdown(_as_text(result.reply) or "*(no text: only special tokens)*")
    why = {"eos": "the end-of-sequence token", "length": "the token budget", "stopped": "Stop"}[result.reason]
    speed = "" if result.first_token_s is None else f" · first token after {result.first_token_s:.2f} s" + (
        "" if result.tokens_per_s is None else f", then {result.tokens_per_s:.1f} tokens/s")
    st.caption(f"{len(result.prompt_ids)} prompt tokens{' (chat template)' if result.chat else ''} · {result.n_new} "
               f"new tokens, ended by {why} · {'sampled' if result.options.sample else 'greedy'}{speed}")


def trace_of(request: TraceRequest) -> Any:
    """The whole sequence's trace from the app's one cache (full, or compact when long): what every page opens."""
    from ui.compact import trace_compact
    from ui.loaders import get_trace, get_trace_form

    form = get_trace_form(request)
    if not form.compact:
        return get_trace(request)
    compact = trace_compact(request, form)
    if compact is None or compact.reply_start is not None:
        return compact
    if compact.token_ids.tolist() != list(request.token_ids):
        raise ValueError("The compact trace re-tokenised the generated text, which splits differently from the "
                         "generated tokens, so it is not this reply's trace. Generate fewer tokens, or raise "
                         "AE_FULL_TRACE_MB for a full trace.")
    return dataclasses.replace(compact, reply_start=request.reply_start)  # a builder that does not set it yet


def _open(request: TraceRequest, model_id: str) -> None:
    """Put the generated sequence into the sidebar: every page then reads its trace."""
    st.session_state.update(request_state(request))
    choose_model(model_id)


def open_everywhere(request: TraceRequest, model_id: str, sidebar: TraceRequest | None) -> None:
    if sidebar == request:
        st.success("Every page reads this sequence now; the reply's start is marked on their token axes.",
                   icon=":material/check_circle:")
        cols = st.columns(len(OPEN_PAGES))
        for col, (path, label, icon) in zip(cols, OPEN_PAGES):
            col.page_link(path, label=label, icon=icon)
        return
    st.button("Open in every page", on_click=_open, args=(request, model_id), key="gen_open",
              icon=":material/open_in_new:", help="Puts the whole sequence (prompt and reply) into the sidebar, so "
                                                  "every page reads this trace.")


GRAPH_FLAG = "_gen_open_graph"


def _open_graph(request: TraceRequest, model_id: str, query: int) -> None:
    """Open the Contributions page on the generated sequence, from the query that wrote the chosen token."""
    _open(request, model_id)
    st.session_state["pg_graph_token"] = int(query)
    st.session_state["pg_graph_layer"] = -1
    st.session_state[GRAPH_FLAG] = True


def graph_button(request: TraceRequest, model_id: str, position: int) -> None:
    """A button to the contribution graph of the token at ``position``: the graph of the query at position - 1,
    whose prediction wrote it (``pages/contributions.py``)."""
    st.button("Contribution graph of this token", on_click=_open_graph, args=(request, model_id, position - 1),
              key="gen_graph", icon=":material/account_tree:",
              help="Which attention mattered for writing it: the Contributions page, built backwards from the query "
                   f"at position {position - 1} that predicted this token (Ferrando & Voita, 2024).")


def reader(result: Generation, trace: Any, tokenizer: Any, focus: Any) -> int:
    """Step through the reply: what the query that wrote each token attended to, on the text, and the candidates.
    Returns the chosen token's position."""
    n_new, start = result.n_new, result.reply_start
    texts = token_texts(tokenizer, result.token_ids)
    s = st.session_state
    if s.get(STEP) not in range(n_new):
        s[STEP] = 0
    step = st.select_slider("Reply token (focus the slider and use the arrow keys)", options=list(range(n_new)),
                            key=STEP, format_func=lambda i: f"{i}: {texts[start + i]!r}")
    c1, c2, c3 = st.columns([2, 1, 1])
    how = c1.radio("Attention of", list(HOW_LABELS), format_func=HOW_LABELS.get, key=HOW, horizontal=True)
    layer = c2.selectbox("Layer", range(trace.n_layers), index=min(focus.layer, trace.n_layers - 1), key=LAYER,
                         disabled=how == "all")
    head = c3.selectbox("Head", range(trace.n_heads), index=min(focus.head, trace.n_heads - 1), key=HEAD,
                        disabled=how != "head")
    position = start + int(step)
    weights = writing_attention(trace, position, how, int(layer), int(head))
    written = texts[position]
    st.caption(f"The model wrote **{_as_text(written.strip()) or '␣'}** (position {position}) from the query at "
               f"position {position - 1}: each earlier token is shaded by that query's weight on it (hover for the "
               "number), relative to the largest. The teal ▸ marks where the reply starts.")
    st.html(attention_text_html(texts, weights, position, start))
    top = pd.DataFrame({"candidate": list(result.candidate_strings[step]),
                        "probability": result.candidate_probs[step].astype(float),
                        "written": result.candidate_ids[step] == result.new_ids[step]})
    st.caption("The model's top next-token candidates at this step (its own distribution, before temperature and "
               "top-p):")
    st.dataframe(top, hide_index=True, column_config={"probability": st.column_config.ProgressColumn(
        "probability", min_value=0.0, max_value=1.0, format="%.3f")}, height=38 + 35 * len(top))
    return position
