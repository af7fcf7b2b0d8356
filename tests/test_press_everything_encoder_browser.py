"""Every button, toggle, checkbox, radio option and tab of every page, pressed once in headless Chromium with the
chapter-3 encoder (``model=custom``), as a user reaches them: no press may bring an exception, a traceback or an
error box (harness/press.py does the pressing; every failure is reported at the end, with its page and its press)."""

from __future__ import annotations

import os

import pytest

from harness.browser import CHROMIUM, CHROMIUM_MISSING, ScriptRuns
from harness.press import press_everything

pytestmark = [pytest.mark.browser, pytest.mark.slow]

if not CHROMIUM.exists():
    pytest.skip(CHROMIUM_MISSING, allow_module_level=True)
# Opt-in for now: one model's pass took more than 15 minutes on a 2-core machine (composition scores, a dataset's
# patching, a UMAP projection that Stop does not interrupt), over CI's 25-minute budget for the whole suite.
if not os.environ.get("AE_PRESS_EVERYTHING"):
    pytest.skip("set AE_PRESS_EVERYTHING=1 to press everything (about 15+ min a model)", allow_module_level=True)

MIN_PRESSES = 40  # the chapter-3 encoder offered 54 on 28 Nov; far fewer means the pages went unpressed


def test_every_press_on_every_page_with_the_chapter3_encoder(app_server, browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    runs = ScriptRuns(page)
    try:
        report = press_everything(page, runs, f"{app_server.url}/?model=custom", app_server.log_path)
    finally:
        context.close()
    print(report.summary())
    assert not report.failures, report.summary()
    assert len(report.presses) >= MIN_PRESSES, report.summary()
