"""The sidebar's model choice: "Pretrained model" (two bundled models in one click, or any hub id or folder) and
"Custom encoder"; old links with model=bert; the link's model_id; the bundled decoder's one-time conversion."""

from __future__ import annotations

import pytest
from app_runs import run_app
from streamlit.testing.v1 import AppTest

from model_core.settings import BUNDLED_DECODER_ID, BUNDLED_MODEL_ID
from ui.fields import _model
from ui.state import CHOICE_KEY, OTHER, PRETRAINED_CHOICES

pytestmark = pytest.mark.slow


def _app(query: dict[str, str] | None = None, state: dict | None = None) -> AppTest:
    at = run_app(state, query, timeout=300)
    _clean(at)
    return at


def _rerun(at: AppTest) -> AppTest:
    """One run through app.py (tests/test_pages.py says why the stored context goes first)."""
    if "_app_context" in at.session_state:
        del at.session_state["_app_context"]
    at.run()
    _clean(at)
    return at


def _clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.sidebar.error, [e.value for e in at.sidebar.error]


def _trace(at: AppTest):
    return at.session_state["_app_context"].trace


def _model_label(at: AppTest) -> str:
    return next(e.label for e in at.sidebar.expander if e.label.startswith("Model: "))


# -- the query parameter ---------------------------------------------------------------------------------------

def test_the_model_parameter_takes_pretrained_custom_and_the_old_bert():
    assert (_model("pretrained"), _model("custom"), _model("bert")) == ("pretrained", "custom", "pretrained")
    with pytest.raises(ValueError, match="not one of pretrained, custom; name a pretrained model with model_id"):
        _model("gpt2")


def test_an_old_link_with_model_bert_still_opens_the_pretrained_bert():
    at = _app(query={"model": "bert", "layer": "2"})
    assert not at.toast, [t.value for t in at.toast]
    assert at.sidebar.radio(key="ctl_model").value == "pretrained"
    assert _trace(at).model_kind == "bert"
    assert "model" not in at.query_params and at.query_params["layer"] == "2"  # "pretrained" is the default


def test_an_old_state_with_model_bert_is_read_as_pretrained():
    at = _app(state={"ctl_model": "bert"})
    assert at.session_state["ctl_model"] == "pretrained" and _trace(at).model_kind == "bert"


def test_the_default_is_the_bundled_bert_named_in_the_model_label():
    at = _app()
    assert at.sidebar.radio(key=CHOICE_KEY).value == BUNDLED_MODEL_ID
    assert _model_label(at) == "Model: MiniLM (bundled BERT)"
    assert [r.label for r in at.sidebar.radio] == ["Model", "Pretrained model"]
    assert list(at.sidebar.radio(key=CHOICE_KEY).options) == list(PRETRAINED_CHOICES.values())
    assert not any("reads a pair as" in c.value for c in at.sidebar.caption)  # BERT: [CLS] A [SEP] B [SEP]


def test_a_link_to_the_bundled_decoder_selects_it_and_says_how_a_pair_is_joined():
    at = _app(query={"model": "pretrained", "model_id": BUNDLED_DECODER_ID})
    assert at.sidebar.radio(key=CHOICE_KEY).value == BUNDLED_DECODER_ID
    assert _model_label(at) == "Model: SmolLM2-135M (bundled decoder)"
    trace = _trace(at)
    assert trace.is_decoder and trace.model_kind == "llama" and trace.n_layers == 30
    captions = " ".join(c.value for c in at.sidebar.caption)
    assert "reads a pair as A, a line break, then B" in captions
    assert at.query_params["model_id"] == BUNDLED_DECODER_ID


# -- one click -------------------------------------------------------------------------------------------------

def test_one_click_switches_to_the_bundled_decoder_and_back_and_the_link_follows():
    at = _app()
    at.sidebar.radio(key=CHOICE_KEY).set_value(BUNDLED_DECODER_ID)
    _rerun(at)
    assert at.session_state["ctl_model_id"] == BUNDLED_DECODER_ID
    assert _trace(at).is_decoder
    assert at.query_params["model_id"] == BUNDLED_DECODER_ID
    at.sidebar.radio(key=CHOICE_KEY).set_value(BUNDLED_MODEL_ID)
    _rerun(at)
    assert _trace(at).model_kind == "bert" and "model_id" not in at.query_params


def test_other_opens_the_id_box_and_a_typed_folder_is_traced(tiny_decoders):
    at = _app()
    assert not at.sidebar.text_input  # no box while a bundled model is chosen
    at.sidebar.radio(key=CHOICE_KEY).set_value(OTHER)
    _rerun(at)
    box = at.sidebar.text_input(key="ctl_model_id")
    assert box.value == BUNDLED_MODEL_ID  # it starts from the current model
    assert at.sidebar.radio(key=CHOICE_KEY).value == OTHER  # and stays on "Other" while it holds a bundled id
    folder = str(tiny_decoders["gpt2"])
    box.input(folder)
    _rerun(at)
    assert _trace(at).model_kind == "gpt2"
    assert at.sidebar.radio(key=CHOICE_KEY).value == OTHER
    assert _model_label(at) == "Model: Pretrained · your model id"  # never the typed id (Markdown)
    assert at.query_params["model_id"] == folder


def test_a_typed_id_never_reaches_the_model_label():
    at = run_app({"ctl_model_id": "[x](https://evil.example/)"}, timeout=300)
    assert _model_label(at) == "Model: Pretrained · your model id"
    assert at.sidebar.radio(key=CHOICE_KEY).value == OTHER


def test_use_the_bundled_model_after_a_bad_id_leaves_other_for_minilm():
    at = run_app({"ctl_model_id": "/definitely/not/here"}, timeout=300)
    assert [b.label for b in at.sidebar.button] == ["Use the bundled model"]
    at.sidebar.button[0].click()
    _rerun(at)
    assert at.sidebar.radio(key=CHOICE_KEY).value == BUNDLED_MODEL_ID and _trace(at).model_kind == "bert"


def test_switching_to_the_custom_encoder_and_back_keeps_the_chosen_pretrained_model():
    at = _app(query={"model_id": BUNDLED_DECODER_ID})
    at.sidebar.radio(key="ctl_model").set_value("custom")
    _rerun(at)
    assert _trace(at).model_kind == "custom"
    assert not at.sidebar.text_input  # the custom encoder with random weights names no model
    at.sidebar.radio(key="ctl_model").set_value("pretrained")
    _rerun(at)
    assert at.sidebar.radio(key=CHOICE_KEY).value == BUNDLED_DECODER_ID and _trace(at).is_decoder


# -- the bundled decoder's first use -----------------------------------------------------------------------------

def test_the_first_use_of_the_bundled_decoder_shows_its_conversion(monkeypatch):
    """With the converted folder missing, the app converts it in a status box that names the step and the wait."""
    from model_core.models import bundled

    real_folder = bundled.ensure_bundled_decoder()  # the real conversion, done once for this machine
    steps: list[str] = []
    converted = {"done": False}

    def fake_ensure(progress=None):
        if not converted["done"] and progress is not None:
            progress("Reading and dequantising SmolLM2-135M-Instruct.Q4_1.gguf…")
            steps.append("converted")
            converted["done"] = True
        return real_folder

    monkeypatch.setattr(bundled, "is_complete", lambda folder: converted["done"])
    monkeypatch.setattr(bundled, "ensure_bundled_decoder", fake_ensure)
    at = _app(query={"model_id": BUNDLED_DECODER_ID})
    assert steps == ["converted"]
    assert len(at.status) == 1
    assert at.status[0].label == "SmolLM2-135M-Instruct is converted and ready." and at.status[0].state == "complete"
    assert "dequantising" in " ".join(m.value for m in at.status[0].markdown)
    assert _trace(at).is_decoder
    _rerun(at)
    assert not at.status  # converted: no status again
