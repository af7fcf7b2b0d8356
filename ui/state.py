"""Shared controls: one sidebar on every page, kept across pages and mirrored in the URL."""

from __future__ import annotations

from typing import Any, Callable

import streamlit as st

from model_core import DEFAULT_TEXT_A, DEFAULT_TEXT_B, TraceRequest
from model_core.settings import BUNDLED_MODEL_ID, Settings, load_settings
from model_core.words import RULE as WORD_RULE

MODEL_LABELS = {"bert": "Pretrained BERT", "custom": "Custom encoder"}
WEIGHT_LABELS = {"random": "Random (seeded)", "pretrained": "Loaded from BERT"}
MAX_SEED = 2**31 - 1


# Query-parameter name -> (session key, parser). Parsers raise ValueError on bad values.
def _int_in(lo: int, hi: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        value = int(raw)
        if not lo <= value <= hi:
            raise ValueError(f"{value} is outside {lo}-{hi}")
        return value
    return parse


def _choice(*options: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in options:
            raise ValueError(f"{raw!r} is not one of {', '.join(options)}")
        return raw
    return parse


def _flag(raw: str) -> bool:
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{raw!r} is not true/false")


def _positions(raw: str) -> list[int]:
    values = [int(v) for v in raw.split(",") if v.strip()]
    if any(not 0 <= v < 20_000 for v in values) or len(values) > 512:
        raise ValueError("not a list of token positions")
    return sorted(set(values))


def _text(raw: str) -> str:
    if len(raw) > 20_000:
        raise ValueError("longer than 20,000 characters")
    return raw


QUERY_PARAMS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "model": ("ctl_model", _choice("bert", "custom")),
    "model_id": ("ctl_model_id", _text),
    "weights": ("ctl_weights", _choice("random", "pretrained")),
    "seed": ("ctl_seed", _int_in(0, MAX_SEED)),
    "norm": ("ctl_norm", _choice("pre", "post")),
    "causal": ("ctl_causal", _flag),
    "layers": ("ctl_layers", _int_in(1, 24)),
    "heads": ("ctl_heads", _int_in(1, 16)),
    "hidden": ("ctl_hidden", _int_in(16, 1024)),
    "a": ("ctl_text_a", _text),
    "b": ("ctl_text_b", _text),
    "truncate": ("ctl_truncate", _flag),
    "words": ("ctl_words", _flag),
    "sel": ("sel_tokens", _positions),
    "layer": ("sel_layer", _int_in(0, 23)),
    "head": ("sel_head", _int_in(0, 15)),
}


def _defaults(settings: Settings) -> dict[str, Any]:
    r = TraceRequest()
    return {"ctl_model": r.model, "ctl_model_id": settings.default_model, "ctl_weights": r.weights,
            "ctl_seed": r.seed, "ctl_norm": r.norm_placement, "ctl_causal": r.causal, "ctl_layers": r.num_layers,
            "ctl_heads": r.num_heads, "ctl_hidden": r.hidden_size, "ctl_text_a": DEFAULT_TEXT_A,
            "ctl_text_b": DEFAULT_TEXT_B, "ctl_truncate": r.truncate, "ctl_words": False, "sel_tokens": [],
            "sel_layer": 0, "sel_head": 0}


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
    for name, (key, parse) in QUERY_PARAMS.items():
        if name not in st.query_params:
            continue
        raw = st.query_params[name]
        try:
            values[key] = parse(raw)
        except ValueError as exc:
            problems.append(f"Ignored the link's `{name}` ({exc}); using the default.")
    for key, value in values.items():
        st.session_state.setdefault(key, value)
    st.session_state["_initialised"] = True
    return problems


def _persist(*keys: str) -> None:
    """Re-assign widget values so Streamlit keeps them when a page does not draw the widget."""
    for key in keys:
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


# The focused (layer, head) outside the pickers' widget state. A picker drawn by a fragment loses its
# widget state when the next full run is another page (Streamlit drops it before the run starts);
# this plain key survives, and the next run's pickers start from it.
FOCUS_KEY = "_focused_head"


def _restore_focus() -> None:
    s = st.session_state
    kept = s.get(FOCUS_KEY)
    if kept is not None:
        for key, value in zip(("sel_layer", "sel_head"), kept):
            if s.get(key) is None:
                s[key] = value


def model_summary(s: Any) -> str:
    """One line naming the chosen model, for the folded model settings' label."""
    if s["ctl_model"] == "bert":
        # Not the typed id itself: an expander label renders Markdown, and a link must never come from user text.
        chosen = (s["ctl_model_id"] or "").strip()
        return "Pretrained BERT · " + ("bundled MiniLM" if chosen in ("", BUNDLED_MODEL_ID) else "your model id")
    if s["ctl_weights"] == "pretrained":
        return "Custom encoder · BERT weights" + (" · causal" if s["ctl_causal"] else "")
    return (f"Custom encoder · {s['ctl_layers']}×{s['ctl_heads']}×{s['ctl_hidden']} · seed {s['ctl_seed']}"
            + (" · causal" if s["ctl_causal"] else ""))


def render_controls(settings: Settings | None = None) -> Any:
    """Draw the shared controls in the sidebar; return the slot for the layer/head pickers
    (``request_from_state`` then reads what they ask for).

    Most used first: the text, then the layer and head (the returned slot, filled by app.py or a page's
    fragment), then the word toggle; the model settings sit folded below, under a label naming the model.
    """
    settings = settings or load_settings()
    _restore_focus()
    _persist(*(key for key, _ in QUERY_PARAMS.values()))
    sb = st.sidebar
    sb.text_area("Sentence A", key="ctl_text_a", height=80, max_chars=20_000)
    sb.text_area("Sentence B (optional)", key="ctl_text_b", height=68, max_chars=20_000)
    slot = sb.container()
    sb.toggle("Words, not WordPieces", key="ctl_words",
              help="Merge the pieces of each word (em ##bed ##ding ##s → embeddings) in every token view. " + WORD_RULE)
    with sb.expander(f"Model: {model_summary(st.session_state)}"):
        st.radio("Model", list(MODEL_LABELS), format_func=MODEL_LABELS.get, key="ctl_model", horizontal=True,
                 help="The from-scratch encoder of chapter 3 of NLP with Transformers, or a real pretrained BERT.")
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
                st.radio("LayerNorm", ["pre", "post"], key="ctl_norm", horizontal=True,
                         format_func={"pre": "Pre-LN (book)", "post": "Post-LN (BERT)"}.get)
                c1, c2, c3 = st.columns(3)
                c1.number_input("Layers", 1, 24, step=1, key="ctl_layers")
                c2.number_input("Heads", 1, 16, step=1, key="ctl_heads")
                c3.number_input("Hidden", 16, 1024, step=16, key="ctl_hidden")
        else:
            st.text_input("Model id", key="ctl_model_id", help=_model_help(settings))
        st.checkbox(f"Truncate past {settings.max_tokens} tokens", key="ctl_truncate")
    return slot


def request_from_state(settings: Settings | None = None) -> TraceRequest:
    """The trace the shared controls ask for.

    Raises:
        ValueError: the custom encoder's options do not fit together (e.g. a hidden size the heads do not
            divide); the message says what to change.
    """
    settings = settings or load_settings()
    s = st.session_state
    return TraceRequest(model=s["ctl_model"], text_a=s["ctl_text_a"], text_b=s["ctl_text_b"],
                        model_id=(s["ctl_model_id"] or "").strip() or settings.default_model,
                        weights=s["ctl_weights"], seed=s["ctl_seed"], norm_placement=s["ctl_norm"],
                        causal=s["ctl_causal"], num_layers=s["ctl_layers"], num_heads=s["ctl_heads"],
                        hidden_size=s["ctl_hidden"], truncate=s["ctl_truncate"])


def _model_help(settings: Settings) -> str:
    allowed = ", ".join(settings.allowed_models) if settings.allowed_models else "any BERT-family hub id or folder"
    return (f"`{BUNDLED_MODEL_ID}` is a real pretrained BERT (MiniLM-L6-H384, uncased) that ships with the app and "
            f"works offline. Also allowed: {allowed}.")


def clamp_head(n_layers: int, n_heads: int) -> tuple[int, int]:
    """Clamp the focused layer and head to the current model's size, with a toast when they move."""
    s = st.session_state
    for key, name, count in (("sel_layer", "Layer", n_layers), ("sel_head", "Head", n_heads)):
        wanted = int(s.get(key, 0))
        s[key] = min(max(wanted, 0), count - 1)
        if s[key] != wanted:
            st.toast(f"{name} {wanted} does not exist in this model ({name.lower()}s 0-{count - 1}); "
                     f"showing {name.lower()} {s[key]}.", icon="⚠️")
    return int(s["sel_layer"]), int(s["sel_head"])


def head_picker(n_layers: int, n_heads: int) -> tuple[int, int]:
    """The layer and head selectors, side by side in the current container (call clamp_head first)."""
    c1, c2 = st.columns(2)
    c1.selectbox("Layer", range(n_layers), key="sel_layer")
    c2.selectbox("Head", range(n_heads), key="sel_head")
    focus = int(st.session_state["sel_layer"]), int(st.session_state["sel_head"])
    st.session_state[FOCUS_KEY] = focus
    return focus


def head_fragment(key: str, draw: Callable[[int, int], None], *, slot: Any, n_layers: int, n_heads: int,
                  settings: Settings | None = None) -> None:
    """Draw the layer/head picker into ``slot`` (the sidebar's) and ``draw(layer, head)`` here, as one fragment.

    A change of layer or head then reruns only this fragment: no trace lookup, no other view rebuilt or
    resent. A widget callback elsewhere on the page can focus a head with ``select_head`` and then
    ``st.rerun(key)``.
    """

    @st.fragment(key=key)
    def fragment() -> None:
        with slot:
            layer, head = head_picker(n_layers, n_heads)
        sync_query_params(settings)
        draw(layer, head)

    fragment()


def select_head(layer: int, head: int) -> None:
    """Focus another head (e.g. from a click on a grid); takes effect on the next run.

    Call it from a widget callback, or before the pickers are drawn in this run."""
    st.session_state["sel_layer"] = int(layer)
    st.session_state["sel_head"] = int(head)
    st.session_state[FOCUS_KEY] = (int(layer), int(head))


def sync_query_params(settings: Settings | None = None) -> None:
    """Write the non-default state into the URL, so a view can be shared and reloads keep it."""
    settings = settings or load_settings()
    defaults = _defaults(settings)
    wanted = {}
    for name, (key, _) in QUERY_PARAMS.items():
        value = st.session_state.get(key, defaults[key])
        if value != defaults[key]:
            if isinstance(value, bool):
                wanted[name] = str(value).lower()
            elif isinstance(value, (list, tuple)):
                wanted[name] = ",".join(str(v) for v in value)
            else:
                wanted[name] = str(value)
    current = {k: st.query_params[k] for k in st.query_params}
    if current != wanted:
        st.query_params.from_dict(wanted)


def open_page_if_requested(flag: str, page: str = "pages/heatmaps.py") -> None:
    """Switch to ``page`` when a widget callback set ``flag`` (callbacks cannot switch pages themselves)."""
    if st.session_state.pop(flag, False):
        st.switch_page(page)
