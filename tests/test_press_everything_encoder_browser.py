"""Every page with the chapter-3 encoder (``model=custom``) in headless Chromium, as a user reaches it: each opens
and draws a figure or says why it does not apply; then every button, toggle, checkbox, radio option and tab on it is
pressed once, and no press may bring an exception, a traceback or an error box. The decoder's test says how (tests/test_press_everything_decoder_browser.py)."""

from __future__ import annotations

import pytest

from harness.browser import CHROMIUM, CHROMIUM_MISSING
from harness.press import drew_or_said, press_in_a_new_tab, press_server

pytestmark = [pytest.mark.browser, pytest.mark.slow]

if not CHROMIUM.exists():
    pytest.skip(CHROMIUM_MISSING, allow_module_level=True)


MIN_PRESSES = 40  # the chapter-3 encoder offered 65 on 28 Nov; far fewer means the pages went unpressed


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = press_server(tmp_path_factory.mktemp("press"))
    yield server
    server.stop()


def test_every_press_on_every_page_with_the_chapter3_encoder(server, browser):
    report = press_in_a_new_tab(browser, server, f"{server.url}/?model=custom", on_open=drew_or_said)
    print(report.summary())
    assert not report.failures, report.summary()
    assert len(report.presses) >= MIN_PRESSES, report.summary()
