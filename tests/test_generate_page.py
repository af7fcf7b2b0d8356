"""The Generate page through AppTest on a tiny decoder with a chat template: generate, trace, open everywhere, step
through the reply; a stopped run keeps its tokens; bad input and an encoder get a message."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from app_runs import rerun
from streamlit.testing.v1 import AppTest

from model_core.generate.generation import (
    DecodingOptions,
    GenerationStream,
    generate,
    prompt_ids,
)
from model_core.models.loading import load_pretrained
from model_core.settings import BUNDLED_DECODER_ID

APP = str(Path(__file__).resolve().parents[1] / "app.py")
PAGE = "pages/generate.py"
PROMPT = "time flies like an arrow"
TEMPLATE = ("{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}<|endoftext|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def chat_llama(tiny_decoders, tmp_path_factory) -> Path:
    from transformers import AutoTokenizer

    folder = Path(shutil.copytree(tiny_decoders["llama"], tmp_path_factory.mktemp("page") / "llama"))
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(folder)
    return folder


def _page(folder: Path | None, **state) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    if folder is not None:
        at.query_params["model"] = "pretrained"
        at.query_params["model_id"] = str(folder)
    rerun(at)
    at.switch_page(PAGE)
    for key, value in state.items():
        at.session_state[key] = value
    return rerun(at)


def _button(at: AppTest, key: str):
    return next(b for b in at.button if b.key == key)


def test_generate_streams_traces_and_opens_the_sequence_in_every_page(chat_llama):
    at = _page(chat_llama, pg_prompt=PROMPT, pg_max_new=6)
    _button(at, "gen_go").click()
    rerun(at)
    assert not at.error, [e.value for e in at.error]
    result = at.session_state["_gen_result"]["generation"]
    expected = generate(load_pretrained(str(chat_llama), device="cpu"), PROMPT, chat=True,
                        options=DecodingOptions(max_new_tokens=6))
    assert result.new_ids.tolist() == expected.new_ids.tolist() and result.chat
    assert at.get("html"), "the reply's attention is drawn on the text"
    assert any(s.label.startswith("Reply token") for s in at.select_slider)
    _button(at, "gen_open").click()
    rerun(at)
    ctx = at.session_state["_app_context"]
    assert ctx.request == result.request(str(chat_llama))
    assert ctx.trace.reply_start == result.reply_start
    assert ctx.trace.token_ids.tolist() == result.token_ids.tolist()


def test_a_reply_tokens_contribution_graph_opens_from_the_query_that_wrote_it(chat_llama):
    at = _page(chat_llama, pg_prompt=PROMPT, pg_max_new=4)
    _button(at, "gen_go").click()
    rerun(at)
    result = at.session_state["_gen_result"]["generation"]
    at.select_slider(key="gen_step").set_value(2)  # the reader's slider, as a user moves it
    rerun(at)
    _button(at, "gen_graph").click()
    rerun(at)
    assert at.title[0].value.startswith("Contributions"), [t.value for t in at.title]
    assert at.session_state["pg_graph_token"] == result.reply_start + 2 - 1
    ctx = at.session_state["_app_context"]
    assert ctx.request == result.request(str(chat_llama)) and ctx.trace.reply_start == result.reply_start
    assert not at.error, [e.value for e in at.error]


def test_the_reader_steps_through_the_reply_for_a_layer_mean(chat_llama):
    at = _page(chat_llama, pg_prompt=PROMPT, pg_max_new=4)
    _button(at, "gen_go").click()
    rerun(at)
    at.select_slider(key="gen_step").set_value(3)
    at.radio(key="gen_how").set_value("all")
    rerun(at)
    assert not at.error, [e.value for e in at.error]
    assert "position" in " ".join(c.value for c in at.caption)


def test_a_run_cut_short_keeps_its_tokens_and_traces_them(chat_llama):
    loaded = load_pretrained(str(chat_llama), device="cpu")
    ids = prompt_ids(loaded.tokenizer, PROMPT, True)
    options = DecodingOptions(max_new_tokens=8)
    stream = GenerationStream(loaded.family, loaded.model, loaded.tokenizer, ids, options, chat=True)
    steps = []
    for step in stream:  # two tokens, then the Stop click's rerun cuts the streaming run short
        steps.append(step)
        if len(steps) == 2:
            break
    job = {"model_id": str(chat_llama), "prompt": PROMPT, "chat": True, "options": options, "started": True,
           "prompt_ids": ids}
    at = _page(chat_llama, _gen_job=job, _gen_partial=steps)
    result = at.session_state["_gen_result"]["generation"]
    assert result.reason == "stopped" and result.new_ids.tolist() == [s.token_id for s in steps]
    assert "_gen_job" not in at.session_state
    assert at.get("html") and not at.error


@pytest.mark.parametrize("state, message", [
    (dict(pg_prompt="   "), "prompt is empty"),
    (dict(pg_prompt=PROMPT, pg_max_new=1024), "new tokens fit"),
])
def test_bad_input_gets_a_message_and_the_page_keeps_working(chat_llama, state, message):
    at = _page(chat_llama, **state)
    _button(at, "gen_go").click()
    rerun(at)
    assert any(message in e.value for e in at.error), [e.value for e in at.error]
    assert "_gen_result" not in at.session_state


@pytest.mark.slow
def test_an_encoder_says_why_and_its_button_switches_to_the_bundled_decoder():
    at = _page(None)  # the default model: the bundled MiniLM encoder
    assert any("encoder" in i.value for i in at.info)
    assert not [b for b in at.button if b.key == "gen_go"]
    _button(at, "gen_use_decoder").click()
    rerun(at)
    assert at.session_state["ctl_model_id"] == BUNDLED_DECODER_ID
    assert _button(at, "gen_go") is not None and not at.error


@pytest.mark.slow
@pytest.mark.parametrize("n_tokens", [128, 512])
def test_the_page_works_with_smollm2_at_long_prompts(n_tokens):
    from harness.texts import text_of

    tok = load_pretrained(BUNDLED_DECODER_ID, device="cpu").tokenizer
    prompt = tok.decode(tok(text_of(n_tokens, 1))["input_ids"][:n_tokens])
    at = AppTest.from_file(APP, default_timeout=600)
    at.query_params["model"] = "pretrained"
    at.query_params["model_id"] = BUNDLED_DECODER_ID
    rerun(at)
    at.switch_page(PAGE)
    at.session_state["pg_prompt"] = prompt
    at.session_state["pg_max_new"] = 4
    rerun(at)
    _button(at, "gen_go").click()
    rerun(at)
    assert not at.error, [e.value for e in at.error]
    result = at.session_state["_gen_result"]["generation"]
    assert len(result.prompt_ids) >= n_tokens and 1 <= result.n_new <= 4
    assert at.get("html") and any(s.label.startswith("Reply token") for s in at.select_slider)


def test_a_link_to_a_generated_sequence_opens_its_trace_with_the_reply_marked(chat_llama):
    result = generate(load_pretrained(str(chat_llama), device="cpu"), PROMPT, chat=True,
                      options=DecodingOptions(max_new_tokens=5))
    at = AppTest.from_file(APP, default_timeout=180)
    for name, value in {"model": "pretrained", "model_id": str(chat_llama), "text_a": result.text, "text_b": "",
                        "token_ids": ",".join(map(str, result.token_ids.tolist())),
                        "reply_start": str(result.reply_start)}.items():
        at.query_params[name] = value
    rerun(at)
    ctx = at.session_state["_app_context"]
    assert ctx.trace.token_ids.tolist() == result.token_ids.tolist() and ctx.trace.reply_start == result.reply_start
    assert at.query_params["reply_start"] == str(result.reply_start)  # the URL keeps it
