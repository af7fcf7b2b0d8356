"""The activation patching page (AppTest) on a tiny Llama-like decoder (GQA), on the bundled encoder, and on the
bundled SmolLM2 with a ready pair; the ``patch`` verb on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest
from tiny_models import build_tiny_decoder

from harness.apptest import open_page

ROOT = Path(__file__).resolve().parents[1]
PAGE = "pages/patching.py"
TINY_PAIR = {"pg_clean": "The cat sat on the mat", "pg_corrupt": "The bank sat on the mat",
             "pg_patch_answer": " cat", "pg_patch_foil": " bank"}


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    return build_tiny_decoder("llama", tmp_path_factory.mktemp("patch-page") / "llama")


def _open(model_id: str | None, query: dict | None = None, **state) -> AppTest:
    """app.py on ``model_id`` (None: the default encoder), then the patching page, with ``state`` set first."""
    return open_page(PAGE, "Activation patching", model_id=model_id, query=query, state=state)


def _charts(at: AppTest) -> list[str]:
    return [json.loads(c.proto.spec).get("layout", {}).get("title", {}).get("text", "") for c in at.get("plotly_chart")]


def test_the_page_shows_attribution_then_runs_exact_patching(llama):
    from ui import patching

    patching._EXACT.clear()  # a finished run of the same pair (another test's) would be shown at once
    at = _open(str(llama), **TINY_PAIR)
    assert not at.error, [e.value for e in at.error]
    assert [m.label for m in at.metric][:2] == ["Clean metric", "Corrupted metric"]
    titles = _charts(at)
    assert "Attribution patching (estimate)" in titles and "Exact patching" not in titles  # not run on opening
    assert any(t.startswith("Attention against effect") for t in titles)
    at.button(key="patch_run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    titles = _charts(at)
    assert "Exact patching" in titles and "Exact patching of resid_pre" in titles
    at.radio(key="pg_patch_resid").set_value("attribution").run()
    assert "Attribution patching of resid_pre" in _charts(at)
    assert any(m.label.startswith("Rank correlation") for m in at.metric)
    labels = [b.label for b in at.get("download_button")]
    assert {"Exact heads grid (CSV)", "Exact residual grid (CSV)", "Attribution heads grid (CSV)",
            "Attribution residual grid (CSV)", "Attention beside effect (CSV)"} <= set(labels)
    rows = at.dataframe[0].value
    assert len(rows) == 2 * 4 and {"attention", "norm_weighted", "dla", "effect", "previous_token"} <= set(rows)


def test_a_stopped_run_shows_its_partial_grid(llama):
    from ui import patching
    from ui.patching import PARTIAL_KEY

    patching._EXACT.clear()  # a finished run of the same pair (an earlier test's) would be shown instead

    at = _open(str(llama), **TINY_PAIR)
    assert PARTIAL_KEY not in at.session_state  # nothing stopped yet
    n_tokens = int(at.metric[2].value)
    from model_core.effects.patching import ExactPatching
    from model_core.trace.request import TraceRequest
    from ui.patching import model_request

    model = model_request(TraceRequest("pretrained", "x", model_id=str(llama)))
    heads = np.full((2, 4), np.nan)
    heads[0] = 0.25
    partial = ExactPatching(heads, np.full((2, n_tokens), np.nan), partial=True)
    at.session_state[PARTIAL_KEY] = ((model, *TINY_PAIR.values()), partial)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert "4 of 8 heads are patched" in at.warning[0].value
    assert "Exact patching (partial)" in _charts(at)
    assert at.button(key="patch_run").label.startswith("Run exact patching")  # it can be finished
    assert "patched passes left" in at.button(key="patch_run").label
    at.button(key="patch_run").click().run()  # resumes: the four heads done are kept, not patched again
    assert not at.exception, [e.value for e in at.exception]
    assert "Exact patching" in _charts(at) and not at.warning
    finished = patching.finished_exact((model, *TINY_PAIR.values()))
    assert not finished.partial and finished.left == 0
    np.testing.assert_array_equal(finished.heads[0], 0.25)  # a real pass would not give 0.25 four times


@pytest.mark.parametrize("state, expected", [
    ({"pg_corrupt": "The river sat on the mat"}, "so they must be the same length"),
    ({"pg_patch_answer": " river"}, "is 2 tokens for this model"),
    ({"pg_corrupt": "The cat sat on the mat"}, "the same tokens"),
])
def test_bad_input_gets_a_message_and_the_app_keeps_working(llama, state, expected):
    at = _open(str(llama), **{**TINY_PAIR, **state})
    assert expected in at.error[0].value
    assert not at.get("plotly_chart")


def test_an_encoder_is_explained_and_offered_the_graph():
    at = _open(None)
    assert "predicts no next token" in at.info[0].value
    assert "Open the Contributions page" in [b.label for b in at.button]


@pytest.mark.slow
def test_the_bundled_smollm2_with_a_ready_pair_from_a_link():
    from model_core.effects.pairs import READY_PAIRS
    from model_core.settings import BUNDLED_DECODER_ID

    pair = READY_PAIRS[1]
    at = _open(BUNDLED_DECODER_ID, query={"clean": pair.clean, "corrupt": pair.corrupt,
                                          "patch_answer": pair.answer, "patch_foil": pair.foil})
    assert not at.error, [e.value for e in at.error]
    clean, corrupt = (float(m.value) for m in at.metric[:2])
    assert clean > 0 > corrupt
    assert "Attribution patching (estimate)" in _charts(at)


@pytest.mark.parametrize("text", ["", "a long text " * 3000])
def test_the_page_needs_only_the_model_not_the_sidebars_text(llama, text):
    """An empty sidebar text (no trace) or a long one (a compact trace) leaves the page working: it reads the model."""
    at = _open(str(llama), **TINY_PAIR, ctl_text_a=text, ctl_text_b="")
    assert not at.error, [e.value for e in at.error]
    assert [m.label for m in at.metric][:2] == ["Clean metric", "Corrupted metric"]
    assert "Attribution patching (estimate)" in _charts(at)


def test_a_softcapped_model_says_the_dla_column_is_before_the_cap(llama, tmp_path):
    softcap = lambda at: [c.value for c in at.caption if "caps its logits" in c.value]
    assert not softcap(_open(str(llama), **TINY_PAIR))
    at = _open(str(build_tiny_decoder("gemma2", tmp_path / "gemma2")), **TINY_PAIR)
    assert not at.error, [e.value for e in at.error]
    assert "dla** column is before it" in softcap(at)[0]


def test_a_link_carries_the_residual_view(llama):
    at = _open(str(llama), query={"patch_resid": "attribution"}, **TINY_PAIR)
    assert at.radio(key="pg_patch_resid").value == "attribution"
    assert "Attribution patching of resid_pre" in _charts(at)
