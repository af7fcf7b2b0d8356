"""Every page at 512 tokens, both models, through the real app (AppTest): what it sends stays within budget.

Per page: every Plotly figure is at most 1,000 px tall, and the page's figures and iframes together stay
within 5 MB, the most a page may send at 512 tokens. Times are measured by ``bench/bench_app.py``; these are
the deterministic sizes that make them possible, checked on the real models and pages.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from harness.browser import app_pages
from harness.texts import text_of

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

MB = 1_000_000
PAGE_BYTES = 5 * MB
MAX_HEIGHT_PX = 1000
# The corpus pages draw a corpus run, not the sidebar's text (bench_space.py, test_corpus_* and test_atlas_page cover
# them).
TEXT_PAGES = [path for path, _ in app_pages() if not path.startswith(("pages/corpus", "pages/head_atlas"))]
MODEL_STATE = {
    "bert": {"ctl_model": "bert"},
    "custom-12x12x768": {"ctl_model": "custom", "ctl_num_hidden_layers": 12, "ctl_num_attention_heads": 12, "ctl_hidden_size": 768},
    "smollm2": {"ctl_model": "pretrained", "ctl_model_id": "bundled:SmolLM2-135M-Instruct"},
}
DECODER = "SmolLM2-135M decoder 30x9"  # harness.texts.DECODERS: its texts of n words are n tokens
# Pages that do not apply to a family say so instead of drawing (pages/predictions.py: encoders; inside: decoders).
NOT_FOR = {"pages/predictions.py": {"bert", "custom-12x12x768"}, "pages/inside.py": {"smollm2"},
           "pages/attribution.py": {"bert", "custom-12x12x768"}, "pages/patching.py": {"bert", "custom-12x12x768"},
           "pages/kv_cache.py": {"bert", "custom-12x12x768"},
           # Generate draws its reply (text and tables, no chart) only after a click: tests/test_generate_page.py
           "pages/generate.py": {"bert", "custom-12x12x768", "smollm2"},
           # Circuits draws only after its Run button (a dataset of its own): tests/test_circuits_page.py
           "pages/circuits.py": {"bert", "custom-12x12x768", "smollm2"}}


def _app_at_512(model_name: str) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    at.session_state["ctl_text_a"] = text_of(512, 0, DECODER if model_name == "smollm2" else "")
    at.session_state["ctl_text_b"] = ""
    for key, value in MODEL_STATE[model_name].items():
        at.session_state[key] = value
    at.run()
    assert at.session_state["_app_context"].trace.n_tokens == 512
    at.model_name = model_name
    return at


@pytest.fixture(scope="module", params=list(MODEL_STATE))
def app_at_512(request):
    """One session a model, shared by the page tests (the trace is built once); a test that changes the session's
    widgets opens its own (the process's trace cache serves it the same trace)."""
    return _app_at_512(request.param)


def page_sizes(at: AppTest, page: str) -> tuple[dict[str, int], dict[str, int]]:
    """Run ``page`` through app.py; (bytes of each figure and iframe, height of each figure)."""
    if "_app_context" in at.session_state:  # see tests/test_pages.py: run through app.py, not the page alone
        del at.session_state["_app_context"]
    at.switch_page(page)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["_app_context"].trace.n_tokens == 512
    sizes, heights = {}, {}
    for i, chart in enumerate(at.get("plotly_chart")):
        spec = json.loads(chart.proto.spec)
        name = f"{i}: {(spec['layout'].get('title') or {}).get('text', '')}"[:60]
        sizes[name] = len(chart.proto.spec.encode())
        heights[name] = spec["layout"].get("height") or 450  # Plotly's default
    for i, frame in enumerate(at.get("iframe")):
        sizes[f"iframe {i}"] = len((frame.proto.srcdoc or "").encode())  # its height: test_bertviz_browser
    return sizes, heights


@pytest.mark.parametrize("page", TEXT_PAGES, ids=[Path(p).stem for p in TEXT_PAGES])
def test_page_at_512_tokens_sends_at_most_5_mb_and_no_figure_over_1000_px(app_at_512, page):
    if app_at_512.model_name in NOT_FOR.get(page, ()):
        pytest.skip(f"{page} says it does not apply to {app_at_512.model_name} (tests/test_decoder_pages.py)")
    sizes, heights = page_sizes(app_at_512, page)
    assert sizes, f"{page} drew nothing"
    assert sum(sizes.values()) <= PAGE_BYTES, sizes
    assert max(heights.values(), default=0) <= MAX_HEIGHT_PX, heights


def test_inside_the_encoder_with_every_step_open_stays_within_the_height_budget(app_at_512):
    if app_at_512.model_name in NOT_FOR["pages/inside.py"]:
        pytest.skip("the walk is the encoder's")
    at = _app_at_512(app_at_512.model_name)  # its own session: open steps would stay open in the shared one
    for step in range(1, 8):
        at.session_state[f"inside_step{step}"] = True
    sizes, heights = page_sizes(at, "pages/inside.py")
    assert len(sizes) >= 15
    assert max(heights.values()) <= MAX_HEIGHT_PX, heights
