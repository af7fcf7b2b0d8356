"""Shared controls: one sidebar on every page, kept across pages and mirrored in the URL."""

from __future__ import annotations

from typing import Any, Callable

import streamlit as st

from model_core import DEFAULT_TEXT_A, DEFAULT_TEXT_B, TraceRequest
from model_core.trace.request import REQUEST_FIELDS
from model_core.settings import BUNDLED_DECODER_ID, BUNDLED_MODEL_ID, Settings, load_settings, resolve_model_id
from model_core.words import RULE as WORD_RULE
from ui.fields import (
    MAX_SEED,
    MODEL_LABELS,
    OLD_MODEL_NAMES,
    OLD_PARAM_NAMES,
    PAGE_PARAMS,
    QUERY_PARAMS,
    control_key,
    param_text,
    request_state,
)
from ui.focus import HEAD_KEY, LAYER_KEY, focus_picker, get_focus, set_focus
from ui.guard import memory_guard
from ui.run_traces import page_traces

WEIGHT_LABELS = {"random": "Random (seeded)", "pretrained": "Loaded from BERT"}

# The pretrained models offered in one click, then any other id. The radio is derived from ``ctl_model_id`` on
# every run (a link, a test or the "Use the bundled model" button set the id alone); OTHER_KEY remembers that the
# user asked for the text box even while it still holds a bundled id.
OTHER = "other"
PRETRAINED_CHOICES = {
    BUNDLED_MODEL_ID: "MiniLM (BERT encoder, bundled)",
    BUNDLED_DECODER_ID: "SmolLM2-135M-Instruct (Llama decoder, bundled)",
    OTHER: "Other hub id or folder",
}
PRETRAINED_NOTES = {
    BUNDLED_MODEL_ID: "all-MiniLM-L6-v2: a BERT encoder, 6 layers × 12 heads, uncased WordPiece. Ships with the app; "
                      "works offline.",
    BUNDLED_DECODER_ID: "A Llama-architecture decoder language model, 30 layers × 9 heads sharing 3 key/value heads, "
                        "byte-level BPE. Ships with the app; works offline (converted once on first use, about a "
                        "minute).",
}
SHORT_NAMES = {BUNDLED_MODEL_ID: "MiniLM (bundled BERT)", "bundled": "MiniLM (bundled BERT)",
               BUNDLED_DECODER_ID: "SmolLM2-135M (bundled decoder)"}
CHOICE_KEY = "ctl_pretrained_choice"
OTHER_KEY = "_other_model_id"


def _defaults(settings: Settings) -> dict[str, Any]:
    return {**request_state(TraceRequest(model_id=settings.default_model, text_a=DEFAULT_TEXT_A, text_b=DEFAULT_TEXT_B)),
            "ctl_words": False, "sel_tokens": [], LAYER_KEY: 0, HEAD_KEY: 0,
            **{key: default for key, _, default in PAGE_PARAMS.values()}}


def init_state(settings: Settings | None = None) -> list[str]:
    """Fill session state once per session: defaults, overridden by valid query parameters.

    Returns:
        One message per query parameter that was ignored, saying why.
    """
    if st.session_state.get("_initialised"):
        return []
    settings = settings or load_settings()
    problems = []
    values = _defaults(settings)
    given = {OLD_PARAM_NAMES.get(name, name): name for name in st.query_params}  # today's name -> the link's
    for name, (key, parse) in QUERY_PARAMS.items():
        if name not in given:
            continue
        raw = st.query_params[given[name]]
        try:
            values[key] = parse(raw)
        except ValueError as exc:
            problems.append(f"Ignored the link's `{given[name]}` ({exc}); using the default.")
    for key, value in values.items():
        st.session_state.setdefault(key, value)
    st.session_state["_initialised"] = True
    return problems


def _persist(*keys: str) -> None:
    """Re-assign widget values so Streamlit keeps them when a page does not draw the widget."""
    for key in keys:
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


def _normalise_model(s: Any) -> None:
    """Old names in session state (a test, the corpus page's "open in the sidebar") become today's."""
    if s.get("ctl_model") in OLD_MODEL_NAMES:
        s["ctl_model"] = OLD_MODEL_NAMES[s["ctl_model"]]


def chosen_model_id(s: Any, settings: Settings | None = None) -> str:
    """The pretrained model id the sidebar asks for, resolved (``model_core.settings.resolve_model_id``: the
    deployment's default when the box is empty, an alias as its id)."""
    return resolve_model_id(s.get("ctl_model_id"), settings)


def pretrained_choice(s: Any, settings: Settings | None = None) -> str:
    """Which one-click choice the model id is (a ``PRETRAINED_CHOICES`` key), or OTHER."""
    model_id = chosen_model_id(s, settings)
    return OTHER if s.get(OTHER_KEY) or model_id not in PRETRAINED_CHOICES else model_id


def choose_model(model_id: str) -> None:
    """Ask for a pretrained model by id (a callback, or before the sidebar is drawn), leaving the id box."""
    st.session_state["ctl_model_id"] = model_id
    st.session_state[OTHER_KEY] = False


def use_bundled_decoder() -> None:
    """A callback for a decoder-only page's "Use SmolLM2" button: the pretrained model, the bundled decoder."""
    st.session_state["ctl_model"] = "pretrained"
    choose_model(BUNDLED_DECODER_ID)


def _on_pretrained_choice() -> None:
    choice = st.session_state[CHOICE_KEY]
    if choice == OTHER:
        st.session_state[OTHER_KEY] = True  # the id stays: the box starts from it
    else:
        choose_model(choice)


def model_summary(s: Any, settings: Settings | None = None) -> str:
    """One line naming the chosen model, for the folded model settings' label."""
    if OLD_MODEL_NAMES.get(s["ctl_model"], s["ctl_model"]) == "pretrained":
        # Not the typed id itself: an expander label renders Markdown, and a link must never come from user text.
        chosen = chosen_model_id(s, settings)
        return SHORT_NAMES.get(chosen, "Pretrained · your model id")
    if s["ctl_weights"] == "pretrained":
        return "Custom encoder · BERT weights" + (" · causal" if s["ctl_causal"] else "")
    shape = "×".join(str(s[control_key(f)]) for f in ("num_hidden_layers", "num_attention_heads", "hidden_size"))
    return f"Custom encoder · {shape} · seed {s['ctl_seed']}" + (" · causal" if s["ctl_causal"] else "")


def text_max_chars(settings: Settings | None = None) -> int:
    """The most characters a text box takes: the deployment's character cap (``Settings.max_text_chars``: 16 a token
    of AE_MAX_TOKENS, 65,536 at 4,096 tokens, 131,072 at 8,192), as a link's (``ui.fields.link_text_chars``).
    English is about 4.3 characters a token; code and other scripts run longer."""
    return (settings or load_settings()).max_text_chars


def __getattr__(name: str) -> int:
    # TEXT_MAX_CHARS, the old constant, read when asked: the cap follows AE_MAX_TOKENS, set after this import.
    if name == "TEXT_MAX_CHARS":
        return text_max_chars()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def text_from_upload(data: bytes, name: str, max_chars: int | None = None) -> tuple[str | None, str | None]:
    """(the text, None), or (the text's first ``max_chars`` (default ``text_max_chars()``), a note), or (None, why it
    cannot be read)."""
    from model_core.corpus.sources import CorpusInputError, decode_text

    cap = text_max_chars() if max_chars is None else max_chars
    try:
        text = decode_text(data, name)
    except CorpusInputError as exc:
        return None, str(exc)
    if len(text) > cap:
        return text[:cap], (f"{name} has {len(text):,} characters; the text box takes {cap:,} (16 a token of "
                            "AE_MAX_TOKENS), so its first ones are used.")
    return text, None


def _read_text_file() -> None:
    """The uploaded file becomes sentence A (its encoding read from its byte-order mark), or an error under it."""
    upload = st.session_state.get("ctl_text_file")
    st.session_state["_text_file_error"] = None
    if upload is not None:
        text, note = text_from_upload(upload.getvalue(), upload.name)
        st.session_state["_text_file_error"] = note
        if text is not None:
            st.session_state["ctl_text_a"] = text


def render_controls(settings: Settings | None = None) -> Any:
    """Draw the shared controls in the sidebar; return the slot for the layer/head pickers
    (``request_from_state`` then reads what they ask for).

    Most used first: the text, then the layer and head (the returned slot, filled by app.py or a page's
    fragment), then the word toggle; the model settings sit folded below, under a label naming the model.
    """
    settings = settings or load_settings()
    get_focus()  # puts a focus Streamlit dropped with a fragment's picker back, before the URL is written
    _normalise_model(st.session_state)
    _persist(*(key for key, _ in QUERY_PARAMS.values()))
    sb = st.sidebar
    max_chars = settings.max_text_chars
    sb.text_area("Sentence A", key="ctl_text_a", height=80, max_chars=max_chars)
    sb.file_uploader("…or open a text file", type=["txt", "md", "text", "log", "csv", "json", "py"],
                     key="ctl_text_file", on_change=_read_text_file, help="Its text fills the box above. A long prompt or a document: a decoder "
                     "reads up to AE_MAX_TOKENS tokens (4,096 by default); past a few hundred, the trace is compact.")
    if st.session_state.get("_text_file_error"):
        sb.error(st.session_state["_text_file_error"])
    sb.text_area("Sentence B (optional)", key="ctl_text_b", height=68, max_chars=max_chars)
    slot = sb.container()
    sb.toggle("Words, not WordPieces", key="ctl_words",
              help="Merge the pieces of each word (em ##bed ##ding ##s → embeddings) in every token view. " + WORD_RULE)
    with sb.expander(f"Model: {model_summary(st.session_state, settings)}"):
        st.radio("Model", list(MODEL_LABELS), format_func=MODEL_LABELS.get, key="ctl_model", horizontal=True,
                 help="A real pretrained model (a BERT encoder, or a decoder language model such as GPT-2 or a "
                      "Llama-like one), or the from-scratch encoder of chapter 3 of NLP with Transformers.")
        model = st.session_state["ctl_model"]
        if model == "custom":
            st.radio("Weights", list(WEIGHT_LABELS), format_func=WEIGHT_LABELS.get, key="ctl_weights",
                     horizontal=True, help="Random weights as in the book, or a BERT checkpoint's weights loaded "
                                           "into the custom encoder (post-LayerNorm, like BERT).")
            pretrained = st.session_state["ctl_weights"] == "pretrained"
            st.toggle("Causal mask", key="ctl_causal",
                      help="np.tril mask applied with masked_fill(mask == 0, -inf) before the softmax.")
            if pretrained:
                st.text_input("BERT weights from", key="ctl_model_id", help=_model_help(settings))
            else:
                st.number_input("Seed", min_value=0, max_value=MAX_SEED, step=1, key="ctl_seed")
                st.radio("LayerNorm", ["pre", "post"], key=control_key("norm_placement"), horizontal=True,
                         format_func={"pre": "Pre-LN (book)", "post": "Post-LN (BERT)"}.get)
                c1, c2, c3 = st.columns(3)
                c1.number_input("Layers", 1, 24, step=1, key=control_key("num_hidden_layers"))
                c2.number_input("Heads", 1, 16, step=1, key=control_key("num_attention_heads"))
                c3.number_input("Hidden", 16, 1024, step=16, key=control_key("hidden_size"))
        else:
            _pretrained_controls(settings)
        st.checkbox(f"Truncate past {settings.max_tokens} tokens", key="ctl_truncate")
    return slot


def request_from_state(settings: Settings | None = None) -> TraceRequest:
    """The trace the shared controls ask for.

    Raises:
        ValueError: the custom encoder's options do not fit together (e.g. a hidden size the heads do not
            divide); the message says what to change.
    """
    settings = settings or load_settings()
    values = {name: st.session_state[control_key(name)] for name in REQUEST_FIELDS}
    return TraceRequest(**{**values, "model_id": chosen_model_id(st.session_state, settings)})


def _pretrained_controls(settings: Settings) -> None:
    """The one-click bundled models, or a box for any other hub id or folder (in the model expander)."""
    s = st.session_state
    s[CHOICE_KEY] = pretrained_choice(s, settings)  # derived from the id, before the radio is drawn
    st.radio("Pretrained model", list(PRETRAINED_CHOICES), format_func=PRETRAINED_CHOICES.get, key=CHOICE_KEY,
             on_change=_on_pretrained_choice, label_visibility="collapsed")
    choice = s[CHOICE_KEY]
    if choice == OTHER:
        st.text_input("Hub id or folder", key="ctl_model_id", help=_model_help(settings))
    else:
        st.caption(PRETRAINED_NOTES[choice])


def _model_help(settings: Settings) -> str:
    allowed = (", ".join(settings.allowed_models) if settings.allowed_models
               else "any hub id or folder of a BERT encoder, GPT-2 or a Llama-like decoder (Llama, Qwen2/3, Mistral, "
                    "Gemma, Phi-3) where the hub is reachable or the model is cached")
    return (f"`{BUNDLED_MODEL_ID}` (a BERT encoder) and `{BUNDLED_DECODER_ID}` (a Llama decoder) ship with the app "
            f"and work offline. Also allowed: {allowed}.")


def head_fragment(key: str, draw: Callable[[int, int], None], *, slot: Any, n_layers: int, n_heads: int,
                  settings: Settings | None = None) -> None:
    """Draw the one layer/head picker into ``slot`` (the sidebar's) and ``draw(layer, head)`` here, as one fragment.

    A change of layer or head then reruns only this fragment: no other view rebuilt or resent. The page's trace
    comes back into its globals from the cache for the rerun (``ui.run_traces.page_traces``); when the cache let it
    go, the whole page reruns and builds it again. A widget callback elsewhere on the page can focus a head with
    ``ui.focus.set_focus`` and then ``st.rerun(key)``. A page that calls this says so in app.py's ``PAGES`` (app.py
    draws the picker otherwise).
    """

    @st.fragment(key=key)
    @memory_guard()  # its own reruns are outside app.py's handler
    def fragment() -> None:
        with page_traces(draw.__globals__):
            with slot:
                focus = focus_picker(n_layers, n_heads)
            sync_query_params(settings)
            draw(focus.layer, focus.head)

    fragment()


select_head = set_focus  # the name older callers import; ui.focus.set_focus is the one writer


def sync_query_params(settings: Settings | None = None) -> None:
    """Write the non-default state into the URL, so a view can be shared and reloads keep it."""
    settings = settings or load_settings()
    defaults = _defaults(settings)
    wanted = {}
    for name, (key, _) in QUERY_PARAMS.items():
        value = st.session_state.get(key, defaults[key])
        if value != defaults[key]:
            wanted[name] = param_text(value)
    current = {k: st.query_params[k] for k in st.query_params}
    if current != wanted:
        st.query_params.from_dict(wanted)


def open_page_if_requested(flag: str, page: str = "pages/heatmaps.py") -> None:
    """Switch to ``page`` when a widget callback set ``flag`` (callbacks cannot switch pages themselves)."""
    if st.session_state.pop(flag, False):
        st.switch_page(page)
