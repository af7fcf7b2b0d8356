"""Every page with the bundled SmolLM2 decoder in headless Chromium, as a user reaches it: each opens without an
exception or an error box and draws a figure or says plainly why it does not apply to a decoder (never speaking of
[CLS] to it); then every button, toggle, checkbox, radio option and tab on it is pressed once, and no press may bring
an exception, a traceback or an error box (harness/press.py does the pressing; every failure is reported at the end,
with its page and its press).

The server runs with a small server's caps (``harness.press.PRESS_ENV``: 4 pairs a dataset, 24 texts a corpus run),
so the runs that presses start stay short; a run still going after ``LONG_RUN_S`` is stopped with its Stop button."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from harness.browser import CHROMIUM, CHROMIUM_MISSING
from harness.press import OPEN_EXPANDERS_JS, drew_or_said, press_in_a_new_tab, press_server
from model_core.settings import BUNDLED_DECODER_ID

pytestmark = [pytest.mark.browser, pytest.mark.slow]

if not CHROMIUM.exists():
    pytest.skip(CHROMIUM_MISSING, allow_module_level=True)

# SmolLM2 offered 62 presses on the 21 pages before the Head atlas on 28 Nov; far fewer means pages went unpressed.
MIN_PRESSES = 40


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from model_core.models.bundled import ensure_bundled_decoder

    ensure_bundled_decoder()
    server = press_server(tmp_path_factory.mktemp("press"))
    yield server
    server.stop()


def opens_as_a_decoders_page(page, title: str) -> list[str]:
    """What each page shows a decoder as it opens: a figure or a note, no [CLS] (unless the page speaks of an
    encoder), and the sidebar naming SmolLM2."""
    problems = drew_or_said(page, title)
    page.evaluate(OPEN_EXPANDERS_JS)  # what a reader opens is read too (an expander's text is hidden until then)
    body = page.locator('[data-testid="stMain"]').inner_text()
    if "[CLS]" in body and "encoder" not in body:
        problems.append("speaks of [CLS] to a decoder")
    if "SmolLM2" not in page.locator('section[data-testid="stSidebar"]').inner_text():
        problems.append("the sidebar does not name SmolLM2")
    return problems


def test_every_press_on_every_page_with_the_decoder(server, browser):
    link = urlencode({"model": "pretrained", "model_id": BUNDLED_DECODER_ID})
    report = press_in_a_new_tab(browser, server, f"{server.url}/?{link}", on_open=opens_as_a_decoders_page)
    print(report.summary())
    assert not report.failures, report.summary()
    assert len(report.presses) >= MIN_PRESSES, report.summary()
