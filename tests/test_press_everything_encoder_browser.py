"""Every button, toggle, checkbox, radio option and tab of every page, pressed once in headless Chromium with the
chapter-3 encoder (``model=custom``), as a user reaches them: no press may bring an exception, a traceback or an
error box. The decoder's test says how (tests/test_press_everything_decoder_browser.py)."""

from __future__ import annotations

import os

import pytest

from harness.browser import CHROMIUM, CHROMIUM_MISSING, AppServer, ScriptRuns
from harness.press import PRESS_ENV, press_everything

pytestmark = [pytest.mark.browser, pytest.mark.slow]

if not CHROMIUM.exists():
    pytest.skip(CHROMIUM_MISSING, allow_module_level=True)
# Opt-in until the Head atlas press fits: on 28 Nov both models went through 20 pages in about 9 minutes each (57-58
# presses), then the atlas's card stage (the QK split of each context) ran past Stop's reach for over 5 minutes.
if not os.environ.get("AE_PRESS_EVERYTHING"):
    pytest.skip("set AE_PRESS_EVERYTHING=1 to press everything (about 10 min a model)", allow_module_level=True)

MIN_PRESSES = 40  # the chapter-3 encoder offered 54 on 28 Nov; far fewer means the pages went unpressed


@pytest.fixture(scope="module")
def press_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("press")
    server = AppServer(folder / "server.log", extra_env={**PRESS_ENV, "AE_CORPUS_DIR": str(folder / "runs")})
    yield server
    server.stop()


def test_every_press_on_every_page_with_the_chapter3_encoder(press_server, browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    runs = ScriptRuns(page)
    try:
        report = press_everything(page, runs, f"{press_server.url}/?model=custom", press_server.log_path,
                                  progress=print)
    finally:
        context.close()
    print(report.summary())
    assert not report.failures, report.summary()
    assert len(report.presses) >= MIN_PRESSES, report.summary()
