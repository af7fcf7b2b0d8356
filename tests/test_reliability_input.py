"""Bad and hostile input, bad model settings and bad links: a clear message or a correct trace, never a traceback.

Each case runs the real app.py (bundled MiniLM BERT, offline) through AppTest.
"""

from __future__ import annotations

import html
import json

import numpy as np
import pytest
from app_runs import run_app
from streamlit.testing.v1 import AppTest

from model_core.settings import BUNDLED_MODEL_ID

pytestmark = pytest.mark.slow

_run = run_app  # app.py once, with session state and link parameters; it raised nothing


def _ctx(at: AppTest):
    return at.session_state["_app_context"]


def _sidebar_error(at: AppTest, raw: bool = False) -> str:
    """The one error in the sidebar, as the user reads it (app.py escapes Markdown in it)."""
    errors = [e.value for e in at.sidebar.error]
    assert len(errors) == 1, errors
    assert "Traceback" not in errors[0] and "File \"" not in errors[0]
    return errors[0] if raw else _as_read(errors[0])


def _as_read(markdown: str) -> str:
    """What the browser shows for app.py's escaped Markdown (character references, word joiners)."""
    return html.unescape(markdown).replace("\u2060", "")


def _home_ticktext(at: AppTest) -> list[str]:
    spec = json.loads(at.get("plotly_chart")[0].proto.spec)
    return spec["layout"]["xaxis"]["ticktext"]


# -- text ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text_a, text_b, message", [
    ("", "", "The text is empty"),
    ("   \n\t ", "", "The text is empty"),
    ("\u200b\u200d\ufeff\x00\x07", "", "The text is empty"),
    ("  ", "fruit flies", "Sentence A is empty"),
    ("word " * 2000, "", "The input has 2002 tokens; the limit is 512"),  # 10,000 characters
    ("x" * 70_000, "", "more than 65,536: 16 characters a token"),  # past the box's max_chars: the server refuses it
    ("\u0301\u0301", "", "Sentence A gives no tokens"),
])
def test_bad_text_gives_a_clear_message_and_no_trace(text_a, text_b, message):
    at = _run({"ctl_text_a": text_a, "ctl_text_b": text_b})
    assert message in _sidebar_error(at)
    assert _ctx(at).trace is None
    assert message in _as_read(at.info[0].value)  # the page says it too, instead of drawing


@pytest.mark.parametrize("text_a, expected", [
    ("?!...;", ("[CLS]", "?", "!", ".", ".", ".", ";", "[SEP]")),
    ("😀 注意 שלום", ("[CLS]", "[UNK]", "[UNK]", "[UNK]", "ש", "##ל", "##ו", "##ם", "[SEP]")),
    ("a\u200bb\x07c\u202e", ("[CLS]", "abc", "[SEP]")),
    ("{{7*7}}", ("[CLS]", "{", "{", "7", "*", "7", "}", "}", "[SEP]")),
])
def test_unusual_text_is_traced_token_by_token(text_a, expected):
    at = _run({"ctl_text_a": text_a, "ctl_text_b": ""})
    assert not at.sidebar.error
    assert _ctx(at).trace.tokens == expected
    assert "49" not in _home_ticktext(at)  # {{7*7}} is never evaluated


@pytest.mark.parametrize("text_a", ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>'])
def test_markup_in_the_text_reaches_plotly_as_escaped_text(text_a):
    at = _run({"ctl_text_a": text_a, "ctl_text_b": ""})
    tokens = _ctx(at).trace.tokens
    assert "<" in tokens and ">" in tokens  # the trace keeps the real characters
    spec = at.get("plotly_chart")[0].proto.spec
    assert "<" not in "".join(_home_ticktext(at))
    assert "&lt;" in _home_ticktext(at)
    heatmap = json.loads(spec)["data"][0]
    # The hover reads its token labels from the category axes (x, y) or from customdata.
    hover_labels = [v for v in np.ravel(np.array(heatmap.get("customdata", []), dtype=object)) if isinstance(v, str)]
    hover_labels += [v for v in heatmap.get("x", []) + heatmap.get("y", []) if isinstance(v, str)]
    assert hover_labels, "found no token labels for the hover"
    assert not any("<" in label for label in hover_labels) and any("&lt;" in label for label in hover_labels)


def test_too_many_tokens_with_truncation_gives_512_tokens():
    at = _run({"ctl_text_a": "word " * 2000, "ctl_text_b": "", "ctl_truncate": True})
    assert _ctx(at).trace.n_tokens == 512


# -- model settings ------------------------------------------------------------------------------

@pytest.mark.parametrize("model_id, message", [
    ("no-such-org/no-such-model", "cannot be reached (offline)"),
    ("../../etc/passwd", "contains '..'"),
    ("models/../../secret", "contains '..'"),
    ("bad id with spaces!", "is not a valid model id"),
    ("/definitely/not/here", "does not exist"),
])
def test_bad_model_id_gives_a_clear_message_and_the_bundled_button(model_id, message):
    at = _run({"ctl_model_id": model_id})
    assert message in _sidebar_error(at)
    assert [b.label for b in at.sidebar.button] == ["Use the bundled model"]


def test_a_folder_that_is_not_a_model_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    at = _run({"ctl_model_id": str(tmp_path)})
    assert "is not a model: it has no config.json" in _sidebar_error(at)


def test_a_model_of_an_unsupported_family_is_refused(tmp_path):
    from transformers import T5Config

    T5Config(num_hidden_layers=1, num_attention_heads=2, d_model=8, d_kv=4, d_ff=8).save_pretrained(tmp_path)
    at = _run({"ctl_model_id": str(tmp_path)})
    assert "is a 't5' model, which Attention Explorer does not support" in _sidebar_error(at)


def test_custom_encoder_with_non_bert_weights_is_refused(tiny_decoders):
    at = _run({"ctl_model": "custom", "ctl_weights": "pretrained", "ctl_model_id": str(tiny_decoders["gpt2"])})
    assert "the custom encoder takes the weights of an encoder of the BERT family" in _sidebar_error(at)


def test_allowlist_refuses_other_models(monkeypatch):
    monkeypatch.setenv("AE_ALLOWED_MODELS", "bert-base-uncased")
    at = _run({"ctl_model_id": "prajjwal1/bert-tiny"})
    assert "is not allowed on this deployment" in _sidebar_error(at)
    assert _run().session_state["_app_context"].trace is not None  # the bundled default still works


def test_remote_code_in_a_model_folder_is_never_run(tmp_path):
    """A folder whose config points at its own Python code: the code must not be imported."""
    marker = tmp_path / "remote_code_ran"
    folder = tmp_path / "evil-bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "bert", "architectures": ["EvilModel"], "hidden_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 2, "intermediate_size": 16, "vocab_size": 30,
        "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"}}))
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    at = _run({"ctl_model_id": str(folder)})
    assert _sidebar_error(at)  # no weights, no tokenizer: refused with a message
    assert not marker.exists(), "the folder's Python code was executed"


def test_local_folders_refused_when_switched_off(monkeypatch):
    from model_core.models.loading import bundled_model_path

    monkeypatch.setenv("AE_ALLOW_LOCAL_MODELS", "false")
    at = _run({"ctl_model_id": str(bundled_model_path())})  # a real BERT folder, still refused
    assert "Loading local folders is switched off" in _sidebar_error(at)


def test_markdown_in_a_model_id_is_shown_as_text():
    at = _run({"ctl_model_id": "[x](https://evil.example/)"})
    # Shown literally: brackets escaped and the URL broken by a word joiner, so Markdown draws no link
    # (the browser test checks that no <a> appears).
    raw = _sidebar_error(at, raw=True)
    assert "&#91;x&#93;" in raw and "https&#58;\u2060//" in raw and "[x](" not in raw
    assert "[x](https://evil.example/)" in _sidebar_error(at)


# -- links (query parameters) --------------------------------------------------------------------

def test_out_of_range_query_params_are_ignored_with_a_toast():
    at = _run(query={"layer": "10000", "head": "-1", "seed": "1e99", "layers": "0", "model": "gpt2", "causal": "maybe",
                     "a": "x" * 65_537})
    toasts = " ".join(t.value for t in at.toast)
    for name in ("layer", "head", "seed", "layers", "model", "causal", "a"):
        assert f"`{name}`" in toasts
    ctx = _ctx(at)
    assert ctx.trace is not None and (ctx.layer, ctx.head) == (0, 0)


def test_layer_and_head_past_the_model_size_are_clamped():
    at = _run(query={"layer": "29", "head": "15"})  # valid in general (SmolLM2 has 30 layers), too big for MiniLM (6 x 12)
    ctx = _ctx(at)
    assert (ctx.layer, ctx.head) == (5, 11)


def test_dotdot_model_id_in_the_link_is_refused():
    at = _run(query={"model_id": "../../../etc"})
    assert "contains '..'" in _sidebar_error(at)


# -- faults: a model that fails at start-up ------------------------------------------------------

def _bundled_button_recovers(at: AppTest) -> None:
    assert _ctx(at).trace is None
    at.sidebar.button[0].click()
    # AppTest runs the page alone after the first run (legacy pages/ mode); without a stored
    # context ui.context.get_context reruns through app.py, as tests/test_pages.py explains.
    del at.session_state["_app_context"]
    at.run()
    assert not at.exception
    assert not at.sidebar.error
    ctx = _ctx(at)
    assert at.session_state["ctl_model_id"] == BUNDLED_MODEL_ID
    assert ctx.trace is not None and ctx.trace.tokens[:3] == ("[CLS]", "time", "flies")
    assert at.get("plotly_chart"), "the home heatmap is drawn after recovery"


def test_bad_default_model_at_start_up_offers_the_bundled_model(monkeypatch):
    monkeypatch.setenv("AE_DEFAULT_MODEL", "no-such-org/no-such-model")
    at = _run()
    assert "no-such-org/no-such-model" in _sidebar_error(at)
    _bundled_button_recovers(at)


def test_bad_model_in_the_link_offers_the_bundled_model():
    at = _run(query={"model_id": "no-such-org/no-such-model"})
    assert "no-such-org/no-such-model" in _sidebar_error(at)
    _bundled_button_recovers(at)
