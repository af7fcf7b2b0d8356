"""Every page of app.py's PAGES in one headless Chromium tab, with the default model and a hostile pair as the text,
opened from the navigation as a user goes from page to page: each finishes without an exception, an error box or a
traceback (``harness.press.Presser`` checks), draws a figure (or says why it draws none), has a heading, logs no
console error, and keeps the hostile text as text: no dialog, no injected element or script in the page or any iframe,
Sentence B shown as typed, and no request leaving 127.0.0.1.

The server starts as ``make run`` starts it (``.venv/bin/streamlit run app.py``). With ``$AE_SCREENSHOT_DIR`` set,
each page is also shot there at its full height (the picture costs the browser seconds a page, so a plain run takes
none). This one tab replaces a fresh browser context a page for each of the two checks (22 pages twice): the same
checks, without a Streamlit boot per page.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlencode, urlparse

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

from playwright.sync_api import expect

from harness.browser import CHROMIUM, CHROMIUM_MISSING, ELEMENT_TIMEOUT_S, ScriptRuns, app_pages, injected_elements
from harness.press import FIGURES, Presser

if not CHROMIUM.exists():
    pytest.skip(CHROMIUM_MISSING, allow_module_level=True)

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
HOSTILE_QUERY = {"a": f"{SCRIPT} {{{{7*7}}}}", "b": IMG}
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}
DRAW_S = 30
# Pages that by design draw their figures only after the user picks something (the default model is the bundled
# BERT): the message they show instead must be there.
NO_FIGURE_UNTIL_INPUT: dict[str, str] = {  # page file -> the message it shows instead of a figure
    "pages/predictions.py": "do not predict next tokens",
    "pages/attribution.py": "predicts no next token",
    "pages/patching.py": "predicts no next token",
    "pages/generate.py": "reads a whole text at once",
    "pages/kv_cache.py": "has no KV cache",
    "pages/circuits.py": "predicts no next token",
    "pages/head_atlas.py": "No atlas of this model yet",
}
# Streamlit's frontend, opened at /<page>, first probes /<page>/_stcore/... to find the app's base path; the 404s it
# logs for those probes are Streamlit's, not ours.
BASE_PATH_PROBES = ("/_stcore/health", "/_stcore/host-config")
SCROLL_HEIGHT_JS = """() => Math.max(1000, ...["stAppViewContainer", "stMain", "stMainBlockContainer"].map(
    id => (document.querySelector(`[data-testid="${id}"]`) || {scrollHeight: 0}).scrollHeight))"""


class Watch:
    """What the tab did since the last page: dialogs (dismissed), console errors, requests and those that left
    127.0.0.1."""

    def __init__(self, page) -> None:
        self.dialogs: list[str] = []
        self.console: list[str] = []
        self.outside: list[str] = []
        self.requests = 0
        page.on("dialog", self._dialog)
        page.on("console", lambda m: self.console.append(f"{m.text} @ {m.location.get('url')}")
                if m.type == "error" and not self._probe(m) else None)
        page.on("request", self._request)

    def _dialog(self, dialog) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def _request(self, request) -> None:
        self.requests += 1
        parsed = urlparse(request.url)
        if parsed.scheme in ("http", "https", "ws", "wss") and parsed.hostname not in LOCAL_HOSTS:
            self.outside.append(request.url)

    @staticmethod
    def _probe(message) -> bool:
        url = urlparse(message.location.get("url") or "")
        return "404" in message.text and url.hostname in LOCAL_HOSTS and url.path.endswith(BASE_PATH_PROBES)

    def problems(self) -> list[str]:
        found = [f"dialog: {d}" for d in self.dialogs] + [f"console error: {c}" for c in self.console]
        found += [f"request outside 127.0.0.1: {u}" for u in sorted(set(self.outside))]
        self.dialogs.clear(), self.console.clear(), self.outside.clear()
        return found


def page_checks(watch: Watch, screenshots: Path | None):
    """The ``on_open`` check of every page (the module's docstring)."""
    files = {title: path for path, title in app_pages()}

    def check(page, title: str) -> list[str]:
        page_file, problems = files[title], []
        drawn = (f'[data-testid="stAlertContentInfo"]:has-text("{NO_FIGURE_UNTIL_INPUT[page_file]}")'
                 if page_file in NO_FIGURE_UNTIL_INPUT else FIGURES)
        try:
            page.locator(drawn).first.wait_for(state="attached", timeout=DRAW_S * 1000)
        except Exception:  # noqa: BLE001 - a Playwright timeout: reported as what is missing
            problems.append("drew no figure" if drawn == FIGURES else
                            f"did not say {NO_FIGURE_UNTIL_INPUT[page_file]!r}")
        if not page.locator('[data-testid="stMain"] h1, [data-testid="stMain"] h2').count():
            problems.append("has no heading")
        page.wait_for_timeout(1000)  # plotly and the iframes finish drawing; an onerror would have fired
        for frame in page.frames[1:]:  # scroll lazy content into view so every iframe loads
            try:
                frame.evaluate("() => window.scrollTo(0, document.body.scrollHeight)")
            except Exception:  # noqa: BLE001 - a frame gone meanwhile
                pass
        problems += injected_elements(page)
        try:  # the input is shown as typed, as text
            expect(page.get_by_label("Sentence B (optional)")).to_have_value(IMG, timeout=ELEMENT_TIMEOUT_S * 1000)
        except AssertionError as exc:
            problems.append(f"Sentence B is not shown as typed: {str(exc)[:200]}")
        if screenshots is not None:
            height = page.evaluate(SCROLL_HEIGHT_JS)  # Streamlit scrolls inside stMain: grow the window to it
            page.set_viewport_size({"width": 1400, "height": min(int(height) + 100, 16000)})
            page.wait_for_timeout(1500)
            page.screenshot(path=str(screenshots / f"{Path(page_file).stem}.png"), full_page=True)
            page.set_viewport_size({"width": 1400, "height": 1000})
        return problems + watch.problems()

    return check


def test_every_page_draws_and_keeps_a_hostile_pair_as_text(app_server, browser):
    screenshots = Path(os.environ["AE_SCREENSHOT_DIR"]) if os.environ.get("AE_SCREENSHOT_DIR") else None
    if screenshots is not None:
        screenshots.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    watch = Watch(page)
    runs = ScriptRuns(page)
    presser = Presser(page, runs, f"{app_server.url}/?{urlencode(HOSTILE_QUERY)}", app_server.log_path,
                      on_open=page_checks(watch, screenshots))
    try:
        presser.start()
        for _, title in app_pages():
            presser.open(title)
            for problem in presser.on_open(page, title):
                presser.report.failures.append(f"{title}: {problem}")
    finally:
        context.close()
    assert watch.requests, "the listener saw no request at all; it cannot be trusted"
    assert not presser.report.failures, "\n".join(presser.report.failures)
