"""The gate in the real app (AE_MAX_RUNS=1, SmolLM2): while one tab's long compact trace holds the model, a tab
with a new text shows its place in the queue and can leave it (a long one in its progress bar), and a tab whose
trace is cached is served at once.

Nothing is slowed down for the test: the busy tab runs the compact trace of 4,096 tokens (about 20 s on a quiet
2-core CPU, docs/performance.md) and a second one waits next, so the gate stays busy longer than the test needs; the
server is stopped when the module ends.
"""

from __future__ import annotations

import urllib.parse

import pytest

from harness.browser import CHROMIUM, CHROMIUM_MISSING
from harness.texts import text_of
from model_core.settings import BUNDLED_DECODER_ID

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.serial]  # it times a queue: alone on the cores

if not CHROMIUM.exists():
    pytest.skip(CHROMIUM_MISSING, allow_module_level=True)

MODEL = "SmolLM2-135M decoder 30x9"
TIMEOUT_MS = 120_000
DRAWN_JS = """n => document.body.innerText.includes('· ' + n + ' tokens')
    && document.querySelectorAll('.js-plotly-plot .main-svg').length > 0
    && !document.querySelector('[data-stale="true"]')"""


def _url(origin: str, text: str) -> str:
    params = {"model": "pretrained", "model_id": BUNDLED_DECODER_ID, "text_b": "", "text_a": text}
    return f"{origin}/heatmaps?{urllib.parse.urlencode(params)}"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from harness.browser import AppServer

    folder = tmp_path_factory.mktemp("gate")
    app = AppServer(folder / "server.log", extra_env={"AE_MAX_RUNS": "1"})
    yield app
    app.stop()


@pytest.fixture(scope="module")
def queue(server):
    """Tabs on one server: ``cached_text`` traced first; ``busy`` holds the gate (a 4,096-token compact trace);
    a second long text waits first in line, and ``probe`` (500 tokens) second."""
    from harness.browser import open_chromium

    with open_chromium() as browser:
        def tab(text: str):
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            page.goto(_url(server.url, text), wait_until="domcontentloaded")
            return page

        cached_text = text_of(12, 1, MODEL)
        first = tab(cached_text)
        first.wait_for_function(DRAWN_JS, arg=12, timeout=TIMEOUT_MS)
        busy = tab(text_of(4096, 2, MODEL))
        # Its progress bar says the pass runs (not waiting): the gate's one turn is taken.
        busy.get_by_text("Running the model").wait_for(timeout=TIMEOUT_MS)
        waiting = tab(text_of(4096, 3, MODEL))  # a second long pass: the gate stays busy past the test's end
        waiting.get_by_text("you are next in the queue").wait_for(timeout=TIMEOUT_MS)
        probe = tab(text_of(500, 4, MODEL))
        yield {"browser": browser, "tab": tab, "cached_text": cached_text, "busy": busy, "probe": probe}


def test_a_waiting_tab_shows_its_place_in_the_queue(queue):
    probe = queue["probe"]
    probe.get_by_text("Waiting for the model: 1 pass ahead of you in the queue, 1 running.").wait_for(
        timeout=TIMEOUT_MS)
    probe.get_by_role("button", name="Leave the queue").wait_for(timeout=10_000)


def test_a_cached_trace_is_served_while_the_gate_is_busy(queue):
    page = queue["tab"](queue["cached_text"])
    page.wait_for_function(DRAWN_JS, arg=12, timeout=TIMEOUT_MS)
    assert page.get_by_text("Waiting for the model").count() == 0
    # The queue had not moved meanwhile: the cached page did not wait behind it.
    assert queue["probe"].get_by_text("1 pass ahead of you").is_visible()


def test_leaving_the_queue_says_so_and_stays_left(queue):
    probe = queue["tab"](text_of(500, 6, MODEL))  # a tab of its own, behind the shared probe: the others keep theirs
    probe.get_by_role("button", name="Leave the queue").wait_for(timeout=TIMEOUT_MS)
    probe.get_by_role("button", name="Leave the queue").click()
    probe.get_by_text("You left the queue").wait_for(timeout=TIMEOUT_MS)
    probe.wait_for_timeout(2000)  # a left pass must not queue again by itself
    assert probe.get_by_text("You left the queue").is_visible()
    assert probe.get_by_text("Waiting for the model").count() == 0
    assert probe.locator('[data-testid="stSidebar"] textarea[aria-label="Sentence A"]').is_editable()
    assert probe.get_by_role("button", name="Join the queue again").is_visible()


def test_a_waiting_compact_trace_shows_the_queue_in_its_bar_and_cancel_leaves_it(queue):
    page = queue["tab"](text_of(4096, 5, MODEL))
    page.get_by_text("Cancel leaves the queue").wait_for(timeout=TIMEOUT_MS)
    assert page.get_by_text("Waiting for the model").count() == 1
    page.get_by_role("button", name="Cancel").click()
    page.get_by_text("Cancelled: the compact trace").wait_for(timeout=TIMEOUT_MS)
