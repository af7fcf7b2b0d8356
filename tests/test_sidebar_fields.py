"""The sidebar's fields are the request's: one list (model_core.trace.request.REQUEST_FIELDS) gives the query parameters,
the session keys, the defaults and the request; links with the older parameter names still open."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from model_core import TraceRequest
from model_core.chapter3.config import EncoderConfig
from model_core.corpus import CorpusModel
from model_core.chapter3.spec import CustomOptions
from model_core.trace.request import MODEL_FIELDS, REQUEST_FIELDS
from ui.corpus import link_params, sidebar_state
from ui.fields import OLD_PARAM_NAMES, QUERY_PARAMS, control_key, request_params

APP = str(Path(__file__).resolve().parents[1] / "app.py")
CUSTOM = TraceRequest("custom", "the cat sat", "on the mat", seed=3, causal=True, norm_placement="post",
                      num_hidden_layers=4, num_attention_heads=2, hidden_size=32, truncate=True)


def test_every_request_field_is_a_query_parameter_and_a_control_by_its_own_name():
    for name in REQUEST_FIELDS:
        assert QUERY_PARAMS[name][0] == control_key(name) == f"ctl_{name}"
    assert set(OLD_PARAM_NAMES.values()) <= set(REQUEST_FIELDS)


def test_the_shape_fields_are_named_as_in_encoder_config():
    shape = {"num_hidden_layers", "num_attention_heads", "hidden_size"}
    assert shape <= {f for f in CustomOptions.__dataclass_fields__} & set(EncoderConfig.__dataclass_fields__)


def test_query_parameters_of_a_request_parse_back_to_the_same_request():
    params = request_params(CUSTOM)
    parsed = {name: QUERY_PARAMS[name][1](raw) for name, raw in params.items()}
    assert TraceRequest(**parsed) == CUSTOM


@pytest.mark.parametrize("model", [CorpusModel.from_options("pretrained", "bundled:SmolLM2-135M-Instruct"),
                                   CorpusModel.from_options("custom", seed=1, causal=True, num_hidden_layers=2,
                                                            num_attention_heads=3, hidden_size=48)])
def test_a_corpus_runs_link_and_sidebar_state_name_the_same_model(model):
    parsed = {name: QUERY_PARAMS[name][1](raw) for name, raw in link_params(model.key()).items()}
    state = sidebar_state(model.key())
    assert CorpusModel.from_request(TraceRequest(**parsed)) == model
    from_state = {name: state[control_key(name)] for name in MODEL_FIELDS if control_key(name) in state}
    assert CorpusModel.from_request(TraceRequest(**from_state)) == model


def _request_from_link(**params: str) -> TraceRequest:
    at = AppTest.from_file(APP, default_timeout=180)
    for name, value in params.items():
        at.query_params[name] = value
    at.run()
    assert not at.exception and not at.toast, ([e.value for e in at.exception], [t.value for t in at.toast])
    return at.session_state["_app_context"].request


def test_a_link_with_the_old_parameter_names_opens_the_same_request_as_one_with_the_new():
    old = _request_from_link(model="custom", layers="2", heads="2", hidden="32", norm="post", a="the cat", b="")
    new = _request_from_link(model="custom", num_hidden_layers="2", num_attention_heads="2", hidden_size="32",
                             norm_placement="post", text_a="the cat", text_b="")
    assert old == new == TraceRequest("custom", "the cat", norm_placement="post", num_hidden_layers=2,
                                      num_attention_heads=2, hidden_size=32)


def test_a_link_may_name_any_layer_and_head_the_page_then_holds_them_to_the_model():
    # SmolLM2 has 30 layers: a link to layer 29 must open it (links were once held to BERT-large's 24).
    assert QUERY_PARAMS["layer"][1]("29") == 29 and QUERY_PARAMS["head"][1]("40") == 40
    with pytest.raises(ValueError):
        QUERY_PARAMS["layer"][1]("-1")
    at = AppTest.from_file(APP, default_timeout=180)
    for name, value in {"model": "custom", "num_hidden_layers": "2", "num_attention_heads": "2",
                        "hidden_size": "32", "text_a": "the cat", "layer": "29", "head": "1"}.items():
        at.query_params[name] = value
    at.run()
    assert not at.exception
    assert (at.session_state["sel_layer"], at.session_state["sel_head"]) == (1, 1)  # clamped, with a toast
    assert any("Layer 29 does not exist" in t.value for t in at.toast)


def test_a_link_carries_as_much_text_as_the_text_box_takes():
    from ui.state import TEXT_MAX_CHARS
    text = "w" * TEXT_MAX_CHARS
    assert QUERY_PARAMS["text_a"][1](text) == text
    with pytest.raises(ValueError, match="longer than"):
        QUERY_PARAMS["text_a"][1](text + "x")
