"""Every button, toggle, checkbox, radio option and tab of every page, pressed once in headless Chromium with the
chapter-3 encoder (``model=custom``), as a user reaches them: no press may bring an exception, a traceback or an
error box. The decoder's test says how (tests/test_press_everything_decoder_browser.py)."""

from __future__ import annotations

import pytest

from harness.browser import CHROMIUM, CHROMIUM_MISSING
from harness.press import press_in_a_new_tab, press_server

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
    report = press_in_a_new_tab(browser, server, f"{server.url}/?model=custom")
    print(report.summary())
    assert not report.failures, report.summary()
    assert len(report.presses) >= MIN_PRESSES, report.summary()
