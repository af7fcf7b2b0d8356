"""Streamlit's own Stop ends work that draws nothing, in headless Chromium: the composition scores of the bundled
SmolLM2 (a cached computation from the weights, with a spinner and no progress bar) stop at their next step when a
user presses Stop in the status widget, instead of running to their end, and the next press computes them whole.

What tells the two apart is the server's CPU from the Stop until its run has ended, against the CPU of a whole run
of the scores (both of one server in one test, so a busy machine slows both alike): without the stop check the
server went on computing (measured: 3.8 CPU-s after the Stop, against 7.1 for a whole run); with it, it stops at
the next layer of the products (0.06 against 5.9). Which grids show after the Stop cannot tell: Streamlit ends a
stopped run at the spinner's close either way, and nothing goes into the cache."""

from __future__ import annotations

from urllib.parse import urlencode

import psutil  # comes with accelerate; bench/bench_test_cpu.py reads processes with it too
import pytest

from harness.browser import CHROMIUM, CHROMIUM_MISSING, new_page, wait_for_run
from harness.press import PROBLEMS_JS, STOPPED_IDLE_JS
from model_core.settings import BUNDLED_DECODER_ID

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.usefixtures("smollm2_converted")]

if not CHROMIUM.exists():
    pytest.skip(CHROMIUM_MISSING, allow_module_level=True)

LINK = urlencode({"model": "pretrained", "model_id": BUNDLED_DECODER_ID})
TIMEOUT_S = 600
COMPOSING = "Composing every pair of heads"
SPINNER_MS = 60_000
STATUS_STOP = "[data-testid='stStatusWidget'] button:has-text('Stop')"


def _toggle(page) -> None:
    switch = page.locator(".st-key-qk_comp_on label").first
    if not switch.is_visible():
        page.get_by_text("Composition scores: which earlier heads", exact=False).first.click()  # open the expander
    switch.click(timeout=60_000)


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def test_streamlits_stop_ends_the_composition_scores_at_their_next_step(app_server, browser):
    server = psutil.Process(app_server.proc.pid)
    with new_page(browser) as (page, errors):
        page.goto(f"{app_server.url}/why_this_key?{LINK}", wait_until="domcontentloaded")
        wait_for_run(page, TIMEOUT_S, text="Composition scores")
        _toggle(page)
        # The spinner shows only while the scores are computed: a cached result (another test's) would fail here.
        composing = page.get_by_text(COMPOSING, exact=False).first
        composing.wait_for(state="visible", timeout=SPINNER_MS)
        page.locator(STATUS_STOP).first.click(timeout=SPINNER_MS)
        at_stop = _cpu_s(server)
        page.wait_for_function(STOPPED_IDLE_JS, timeout=TIMEOUT_S * 1000, polling=50)
        after_stop = _cpu_s(server) - at_stop
        assert page.get_by_text("Q-composition").count() == 0
        assert page.evaluate(PROBLEMS_JS) == []

        # The toggle off and on: the scores computed again, and drawn whole.
        _toggle(page)
        wait_for_run(page, TIMEOUT_S)
        at_start = _cpu_s(server)
        _toggle(page)
        composing.wait_for(state="visible", timeout=SPINNER_MS)
        wait_for_run(page, TIMEOUT_S, text="Strongest pairs")
        whole = _cpu_s(server) - at_start
        assert page.get_by_role("tab", name="K-composition").count() == 1
        assert page.evaluate(PROBLEMS_JS) == []
        assert not errors, errors
        assert after_stop < 0.25 * whole, (after_stop, whole)
