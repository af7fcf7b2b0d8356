"""The direct logit attribution page (AppTest) on the bundled SmolLM2 and on the bundled BERT encoder, and the
``attribute`` verb on the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_page_ok
from streamlit.testing.v1 import AppTest

from harness.apptest import open_page
from model_core.settings import BUNDLED_DECODER_ID

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
PAGE = "pages/attribution.py"
TITLE = "Direct logit attribution"
TEXT = "The capital of France is"


def _open(model_id: str | None, text: str = TEXT, **state) -> AppTest:
    """app.py with ``model_id`` (None: the default encoder) on ``text``, then the attribution page."""
    at = open_page(PAGE, model_id=model_id, query={"text_a": text, "text_b": ""}, state=state)
    assert_page_ok(at, TITLE)
    return at


def _check_line(at: AppTest) -> str:
    return next(c.value for c in at.caption if c.value.startswith("Check:"))


@pytest.mark.slow
def test_the_page_splits_the_top_prediction_against_the_runner_up():
    at = _open(BUNDLED_DECODER_ID)
    line = _check_line(at)
    total, logit = (float(part.split("**")[1]) for part in line.split(";"))
    assert total == pytest.approx(logit, abs=1e-3) and logit > 0  # the top prediction beats the runner-up
    assert len(at.get("plotly_chart")) == 2  # the L x H grid and the parts
    assert "Splitting **logit(' Paris') − logit(' the')**" in at.markdown[0].value
    assert len(at.get("download_button")) == 2  # the grid and the split
    html = next(m.value for m in at.markdown if m.value.startswith("<div"))
    assert html.count("<span") == 5  # one per token of the text, shaded by the split


@pytest.mark.slow
def test_answer_foil_and_bad_input():
    at = _open(BUNDLED_DECODER_ID, pg_answer=" Paris", pg_foil=" London")
    assert "logit(' Paris') − logit(' London')" in at.markdown[0].value
    at.checkbox(key="pg_no_foil").check().run()
    assert_page_ok(at, TITLE)
    assert "Splitting **logit(' Paris')**" in at.markdown[0].value
    at.text_input(key="pg_answer").input(" Parisianism").run()
    assert_page_ok(at, TITLE)
    warning = at.warning[0].value
    assert "3 tokens" in warning and warning.count("' Paris' + 'ian' + 'ism'") == 1  # the pieces, listed once


@pytest.mark.slow
def test_a_top_heads_button_opens_it_in_the_heatmaps():
    at = _open(BUNDLED_DECODER_ID)
    button = next(b for b in at.button if b.label == "Open in heatmaps")
    layer, head = (int(x) for x in button.key.split("_")[-2:])
    button.click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert (at.session_state["sel_layer"], at.session_state["sel_head"]) == (layer, head)
    assert at.title[0].value == "Attention heatmaps"


@pytest.mark.slow
def test_a_long_input_takes_one_more_pass(monkeypatch, bundled_decoder):
    """Past AE_FULL_TRACE_MB the text has a compact trace: the page runs one more pass and gives the full numbers."""
    from model_core.effects.attribution import attribute, top_two
    from model_core.trace.forward import trace_pretrained

    text = "The capital of France is Paris. The capital of Germany is"
    full = trace_pretrained(bundled_decoder, bundled_decoder.family.encode(bundled_decoder.tokenizer, text,
                                                                           max_tokens=64))
    want = attribute(full, bundled_decoder.model, bundled_decoder.family, *top_two(full))
    monkeypatch.setenv("AE_FULL_TRACE_MB", "0.05")  # SmolLM2's full trace: 6 tokens at most
    at = _open(BUNDLED_DECODER_ID, text)
    assert at.session_state["_app_context"].compact is not None
    assert any("ran the model once more" in c.value for c in at.caption)
    assert "only a full trace keeps" in at.info[0].value
    assert len(at.get("plotly_chart")) == 2
    logit = float(_check_line(at).split(";")[1].split("**")[1])
    assert logit == pytest.approx(want.logit, abs=1e-3)


@pytest.mark.slow
def test_an_encoder_is_told_why_and_offered_the_graph():
    at = _open(None, "time flies like an arrow")
    assert "predicts no next token" in at.info[0].value
    assert at.button(key="dla_to_graph").label == "Open the contribution graph"
    assert not at.get("plotly_chart")


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    """The command line run in this process (the model loaded once for the module), as (exit code, out, err)."""
    from model_core.cli.main import main

    code = main(["attribute", "--model", "pretrained", "--text", TEXT, *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow
def test_the_command_line_prints_the_issues_json(capsys):
    code, out, err = _cli(capsys, "--model-id", BUNDLED_DECODER_ID, "--answer", " Paris", "--foil", "runner-up",
                          "--json")
    assert code == 0, err
    got = json.loads(out)
    assert {"tokens", "answer_id", "foil_id", "logit", "embed", "heads", "mlps", "rest"} <= set(got)
    assert len(got["heads"]) == 30 and len(got["heads"][0]) == 9 and len(got["mlps"]) == 30
    parts = got["embed"] + sum(map(sum, got["heads"])) + sum(got["mlps"]) + got["rest"]
    assert parts == pytest.approx(got["logit"], rel=1e-4) and got["logit"] > 0
    assert got["rest"] == 0.0  # a Llama has no biases
    code, out, _ = _cli(capsys, "--model-id", BUNDLED_DECODER_ID)  # the runner-up is the default foil
    assert code == 0 and out.startswith("logit(' Paris') - logit(")
    code, out, _ = _cli(capsys, "--model-id", BUNDLED_DECODER_ID, "--no-foil")
    assert code == 0 and out.startswith("logit(' Paris') after token 4")


@pytest.mark.slow
def test_the_command_line_refuses_an_encoder_and_a_split_answer(capsys):
    code, _, err = _cli(capsys)  # the default model: the bundled MiniLM encoder
    assert code == 1 and "needs a decoder" in err
    code, _, err = _cli(capsys, "--model-id", BUNDLED_DECODER_ID, "--answer", " Parisianism")
    assert code == 1 and "' Paris' + 'ian' + 'ism'" in err


def test_the_verb_is_on_the_command_line():
    out = subprocess.run([sys.executable, "-m", "model_core", "attribute", "--help"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120, check=False)
    assert out.returncode == 0 and "--foil" in out.stdout and "runner-up" in out.stdout


@pytest.mark.slow
def test_smollm2_puts_paris_first_and_its_parts_add_up(bundled_decoder):
    from model_core.effects.attribution import attribute, token_id_of
    from model_core.trace.forward import trace_pretrained

    encoded = bundled_decoder.family.encode(bundled_decoder.tokenizer, TEXT, max_tokens=64)
    trace = trace_pretrained(bundled_decoder, encoded)
    paris = token_id_of(bundled_decoder.tokenizer, " Paris")
    got = attribute(trace, bundled_decoder.model, bundled_decoder.family, paris)
    assert got.logit > 0 and got.total == pytest.approx(got.logit, rel=1e-4)
    london = attribute(trace, bundled_decoder.model, bundled_decoder.family, paris,
                       token_id_of(bundled_decoder.tokenizer, " London"))
    assert london.logit > 0 and london.total == pytest.approx(london.logit, rel=1e-4)


@pytest.fixture(scope="module")
def bundled_decoder():
    from model_core.models.loading import load_pretrained

    return load_pretrained(BUNDLED_DECODER_ID, device="cpu")


def test_a_link_carries_the_split_head_and_the_pieces_are_listed_once(tmp_path):
    """On a tiny Llama: the link's ``dla_head`` picks the head split by source token (layer * n_heads + head)."""
    from tiny_models import build_tiny_decoder

    folder = str(build_tiny_decoder("llama", tmp_path / "llama"))
    at = AppTest.from_file(APP, default_timeout=240)
    for name, value in {"model": "pretrained", "model_id": folder, "text_a": "time flies like an arrow",
                        "text_b": "", "dla_head": "5"}.items():
        at.query_params[name] = value
    at.run()
    at.switch_page(PAGE).run()
    assert_page_ok(at, TITLE)
    assert at.selectbox(key="pg_dla_head").value == 5
    assert any("Layer 1, head 1 moves" in c.value for c in at.caption)
    at.text_input(key="pg_answer").set_value(" xylophonequ").run()
    warning = at.warning[0].value
    assert "The answer ' xylophonequ' is" in warning and "tokens for this model" in warning
    assert "Its pieces" not in warning
