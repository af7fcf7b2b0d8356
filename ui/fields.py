"""The sidebar's fields, derived once from the request's (``model_core.trace.request.REQUEST_FIELDS``): each field's
query parameter (its own name; older links' names still read), session key (``ctl_<field>``) and parser, and a
request written as query parameters or session state. No streamlit: the benches and links use it too."""

from __future__ import annotations

from typing import Any, Callable, Literal, get_args, get_origin, get_type_hints

from model_core import TraceRequest
from model_core.trace.request import REQUEST_FIELDS

MODEL_LABELS = {"pretrained": "Pretrained model", "custom": "Custom encoder"}
OLD_MODEL_NAMES = {"bert": "pretrained"}
"""Values of ``model`` older links carry: "bert" was the pretrained model when BERT was the only family."""
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


def _model(raw: str) -> str:
    value = OLD_MODEL_NAMES.get(raw, raw)
    if value not in MODEL_LABELS:
        raise ValueError(f"{raw!r} is not one of {', '.join(MODEL_LABELS)}; name a pretrained model with model_id")
    return value


def _flag(raw: str) -> bool:
    if raw.lower() in ("1", "true", "yes", "on"):
        return True
    if raw.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{raw!r} is not true/false")


MAX_INDEX = 9_999
"""The largest layer or head a link may name; the page then clamps it to the model's own sizes."""
def link_text_chars() -> int:
    """The longest text a link may carry: the deployment's character cap (``Settings.max_text_chars``: 16 a token of
    AE_MAX_TOKENS, at least 65,536), as much as the sidebar's text boxes take. Read when a link is, since
    AE_MAX_TOKENS sets it; a link of up to 60,000 characters (the cap before) opens under any setting."""
    from model_core.settings import load_settings

    return load_settings().max_text_chars


def _positions(raw: str) -> list[int]:
    values = [int(v) for v in raw.split(",") if v.strip()]
    if any(not 0 <= v < 20_000 for v in values) or len(values) > 512:
        raise ValueError("not a list of token positions")
    return sorted(set(values))


def _text(raw: str) -> str:
    cap = link_text_chars()
    if len(raw) > cap:
        raise ValueError(f"longer than {cap:,} characters (16 a token of AE_MAX_TOKENS)")
    return raw


def control_key(field: str) -> str:
    """The session-state key of the sidebar control that sets the request's ``field``."""
    return f"ctl_{field}"


LIMITS = {"seed": (0, MAX_SEED), "num_hidden_layers": (1, 24), "num_attention_heads": (1, 16), "hidden_size": (16, 1024)}
"""The sidebar's bounds for the request's whole-number fields (links are held to the same)."""
OLD_PARAM_NAMES = {"a": "text_a", "b": "text_b", "norm": "norm_placement", "layers": "num_hidden_layers",
                   "heads": "num_attention_heads", "hidden": "hidden_size"}
"""Query parameters older links carry -> today's name (the request's field)."""


def _field_parser(field: str) -> Callable[[str], Any]:
    """A query parameter's parser, from the request field's type."""
    if field == "model":
        return _model  # also reads the old name "bert"
    hint = get_type_hints(TraceRequest)[field]
    if get_origin(hint) is Literal:
        return _choice(*get_args(hint))
    if hint is bool:
        return _flag
    if hint is int:
        return _int_in(*LIMITS[field])
    return _text


FOCUS_LAYER_KEY = "sel_layer"
FOCUS_HEAD_KEY = "sel_head"
"""The Layer/Head pickers' widget keys (``ui.focus`` owns the focus; links and tests set these)."""

QUERY_PARAMS: dict[str, tuple[str, Callable[[str], Any]]] = {
    **{field: (control_key(field), _field_parser(field)) for field in REQUEST_FIELDS},
    "words": ("ctl_words", _flag),
    "sel": ("sel_tokens", _positions),
    "layer": (FOCUS_LAYER_KEY, _int_in(0, MAX_INDEX)),
    "head": (FOCUS_HEAD_KEY, _int_in(0, MAX_INDEX)),
}
"""Query-parameter name -> (session key, parser): the request's fields by their own names, then the view's."""


def _float_in(lo: float, hi: float, *, open_lo: bool = False, open_hi: bool = False) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        value = float(raw)
        if value != value or value < lo or value > hi or (open_lo and value == lo) or (open_hi and value == hi):
            left, right = "(" if open_lo else "[", ")" if open_hi else "]"
            raise ValueError(f"{value} is outside {left}{lo}, {hi}{right}")
        return value
    return parse


PRESSES = ("streaming_llm", "knorm", "snapkv", "tova", "observed_attention")
"""The KV-cache compression policies the KV cache page offers (kvpress 0.5.5's names)."""

PAGE_PARAMS: dict[str, tuple[str, Callable[[str], Any], Any]] = {
    # Contributions: the token the graph starts from (-1: the last), its threshold, the layer opened below it.
    "graph_token": ("pg_graph_token", _int_in(-1, 19_999), -1),
    "graph_threshold": ("pg_graph_threshold", _float_in(0.01, 0.99), 0.04),
    "graph_layer": ("pg_graph_layer", _int_in(-1, MAX_INDEX), -1),
    "graph_row": ("pg_graph_row", _int_in(-1, 19_999), -1),
    # Direct logit attribution: the answer and foil as written ("" = the top prediction / the runner-up).
    "answer": ("pg_answer", _text, ""),
    "foil": ("pg_foil", _text, ""),
    "no_foil": ("pg_no_foil", _flag, False),
    "dla_head": ("pg_dla_head", _int_in(-1, 10**7), -1),  # layer * n_heads + head split by source (-1: strongest)
    # Activation patching: the two prompts, the answer and the foil ("" = the page's ready pair).
    "clean": ("pg_clean", _text, ""),
    "corrupt": ("pg_corrupt", _text, ""),
    "patch_answer": ("pg_patch_answer", _text, ""),
    "patch_foil": ("pg_patch_foil", _text, ""),
    "patch_resid": ("pg_patch_resid", _choice("exact", "attribution"), "exact"),
    # Generate: the prompt and the decoding settings.
    "prompt": ("pg_prompt", _text, "What is the capital of France?"),  # a first press of Generate answers something
    "chat": ("pg_chat", _flag, True),
    "max_new": ("pg_max_new", _int_in(1, 1024), 48),
    "sampling": ("pg_sampling", _flag, False),
    "temperature": ("pg_temperature", _float_in(0.0, 5.0, open_lo=True), 1.0),
    "top_p": ("pg_top_p", _float_in(0.0, 1.0, open_lo=True), 0.95),
    "gen_seed": ("pg_gen_seed", _int_in(0, MAX_SEED), 0),
    # KV cache: the policy and the compression ratio.
    "press": ("pg_press", _choice(*PRESSES), "snapkv"),
    "ratio": ("pg_ratio", _float_in(0.0, 1.0, open_lo=True, open_hi=True), 0.5),
}
"""The new pages' own link parameters: name -> (session key, parser, default). A page reads and writes its values
through ``st.session_state[key]`` (widgets with ``key=``); the URL mirrors them like the sidebar's."""

QUERY_PARAMS.update({name: (key, parse) for name, (key, parse, _) in PAGE_PARAMS.items()})


def request_state(request: TraceRequest, names: tuple[str, ...] = REQUEST_FIELDS) -> dict[str, Any]:
    """Session-state values that put the request's ``names`` into the sidebar."""
    return {control_key(name): getattr(request, name) for name in names}


def param_text(value: Any) -> str:
    """A value as a query parameter writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def request_params(request: TraceRequest, names: tuple[str, ...] = REQUEST_FIELDS) -> dict[str, str]:
    """The request's ``names`` as query parameters, leaving out those at their default (and an empty model id)."""
    default = TraceRequest()
    return {name: param_text(getattr(request, name)) for name in names
            if getattr(request, name) is not None and (name == "model" or getattr(request, name) != getattr(default, name))}
