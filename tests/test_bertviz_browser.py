"""The bertviz page in the real app, in headless Chromium, with every outside request blocked and counted.

For each view (head, model, neuron) and both models: the SVG is drawn inside the iframe, the
console has no errors, no request leaves the app's origin, the scripts come from
/app/static/vendor/, and the iframe is tall enough that nothing is cut off.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlencode

import pytest

from attention_explorer.views import size
from attention_explorer import views as bv

from harness.browser import CHROMIUM, CHROMIUM_MISSING, ROOT, nav_to

SHOTS = Path("/tmp/bertviz_browser")
SMALL_CUSTOM = {"model": "custom", "layers": "2", "heads": "4", "hidden": "64"}
LABELS = {"head": "Head view", "model": "Model view", "neuron": "Neuron view"}

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=CHROMIUM_MISSING),
    pytest.mark.skipif(bool(bv.vendor_missing(str(ROOT / "static"))),
                       reason="static/vendor/ is missing bertviz's JavaScript: run scripts/install_assets.sh (needs npm)"),
]


class Visit:
    """One page in a fresh context: outside requests aborted and counted, console errors kept."""

    def __init__(self, browser, origin: str):
        self.origin = origin
        self.outside: list[str] = []
        self.errors: list[str] = []
        self.local: list[str] = []
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.failed: list[str] = []  # which address a "Failed to load resource" error was about
        self.page.on("response", lambda r: self.failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
        self.page.on("requestfailed", lambda r: self.failed.append(f"{r.failure} {r.url}"))

    def _route(self, route):
        url = route.request.url
        if url.startswith(self.origin) or url.startswith("about:") or url.startswith("data:") or url.startswith("blob:"):
            self.local.append(url)
            route.continue_()
        else:
            self.outside.append(url)
            route.abort()

    def goto_page(self, params: dict[str, str]) -> None:
        # Open the app at its root and follow the navigation's link: a first load at /bertviz makes
        # Streamlit's frontend probe /bertviz/_stcore/... for a base path, and log two 404s.
        self.page.goto(f"{self.origin}/?{urlencode(params)}", wait_until="domcontentloaded")
        nav_to(self.page, "bertviz views")
        self.page.get_by_role("heading", name="bertviz views").wait_for(timeout=120_000)

    def open_view(self, kind: str, params: dict[str, str]):
        self.goto_page(params)
        if kind != "head":
            self.page.get_by_text(LABELS[kind], exact=True).click()
        title = f"bertviz {LABELS[kind].lower()}"
        self.page.locator(f'iframe[title="{title}"]').wait_for(timeout=60_000)
        frame = self.page.frame_locator(f'iframe[title="{title}"]')
        frame.locator("svg line").first.wait_for(state="attached", timeout=60_000)
        return self.page.locator(f'iframe[title="{title}"]'), frame

    def close(self):
        self.context.close()


def _frame_of(iframe):
    return iframe.element_handle().content_frame()


@pytest.mark.parametrize("model", ["bert", "custom"])
@pytest.mark.parametrize("kind", bv.VIEW_KINDS)
def test_view_draws_offline_without_errors(app_url, browser, kind, model):
    params = {"a": "time flies like an arrow", "b": "fruit flies like a banana"}
    if model == "custom":
        params |= SMALL_CUSTOM
    visit = Visit(browser, app_url)
    try:
        iframe, frame = visit.open_view(kind, params)
        content = _frame_of(iframe)
        n_lines = content.evaluate("document.querySelectorAll('svg line').length")
        n_heads = 12 if model == "bert" else 4
        n = 13
        if kind == "head":
            assert n_lines >= n_heads * n * n  # every weight of the layer, for every head
        elif kind == "model":
            assert n_lines >= (6 if model == "bert" else 2) * n_heads * n * n
        else:
            assert n_lines >= n * n
            assert content.evaluate("document.querySelectorAll('#queries .vector').length") == n
        # never cut off: the page inside fits the iframe's height
        inner = content.evaluate("document.documentElement.scrollHeight")
        outer = iframe.evaluate("e => e.clientHeight")
        assert inner <= outer, (inner, outer)
        SHOTS.mkdir(exist_ok=True)
        iframe.screenshot(path=str(SHOTS / f"{kind}-{model}.png"))
        vendor = [u for u in visit.local if "/app/static/vendor/" in u]
        d3 = "d3v3.min.js" if kind == "head" else "d3v5.min.js"
        assert any(u.endswith("/require.js") for u in vendor) and any(u.endswith(d3) for u in vendor), vendor
        assert visit.errors == [], (visit.errors, visit.failed)
        assert visit.outside == []
    finally:
        visit.close()


def test_pair_filter_draws_only_the_a_to_b_block(app_url, browser):
    visit = Visit(browser, app_url)
    try:
        iframe, frame = visit.open_view("head", {"a": "time flies like an arrow", "b": "fruit flies like a banana"})
        content = _frame_of(iframe)
        content.select_option("#filter", label="Sentence A -> Sentence B")
        content.wait_for_function("document.querySelectorAll('svg line').length < 12 * 13 * 13")
        # [CLS] time flies like an arrow [SEP] -> fruit flies like a banana [SEP]: 7 x 6 per head
        assert content.evaluate("document.querySelectorAll('svg line').length") == 12 * 7 * 6
        assert visit.errors == [] and visit.outside == []
    finally:
        visit.close()


def test_long_input_offers_a_token_window_instead_of_freezing(app_url, browser):
    words = ("the quick brown fox jumps over the lazy dog while a small bird sings in the old tree " * 8).split()
    visit = Visit(browser, app_url)
    try:
        page = visit.page
        visit.goto_page({"a": " ".join(words[:60]), "b": " ".join(words[60:120])})
        page.get_by_text("Model view", exact=True).click()
        page.get_by_text("bertviz's model view of 123 tokens").wait_for(timeout=60_000)
        SHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SHOTS / "long-model-warning.png"), full_page=True)
        assert page.get_by_text("Open the heatmaps instead").count() == 1
        iframe = page.locator('iframe[title="bertviz model view"]')
        iframe.wait_for(timeout=60_000)
        content = _frame_of(iframe)
        content.wait_for_selector("svg line", state="attached", timeout=60_000)
        n_lines = content.evaluate("document.querySelectorAll('svg line').length")
        assert 0 < n_lines <= size.MAX_ELEMENTS
        SHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SHOTS / "long-model-window.png"), full_page=True)
        # The head view starts on a window that redraws quickly (size.DEFAULT_ELEMENTS) and fits its frame.
        page.get_by_text("Head view", exact=True).click()
        page.get_by_text("It starts with the first").wait_for(timeout=60_000)
        head = page.locator('iframe[title="bertviz head view"]')
        head.wait_for(timeout=60_000)
        page.wait_for_timeout(1000)
        inner = _frame_of(head).evaluate("document.documentElement.scrollHeight")
        assert inner <= head.evaluate("e => e.clientHeight") <= 1000
        # Widened to its most (90 tokens of 12 heads), the view is ~2,000 px of bertviz's layout: the frame stops
        # at 1,000 px and the view scrolls inside it.
        page.get_by_role("slider").nth(1).press("End")
        page.get_by_text("Shortened to").wait_for(timeout=60_000)
        page.wait_for_timeout(1500)
        head = page.locator('iframe[title="bertviz head view"]')
        inner = _frame_of(head).evaluate("document.documentElement.scrollHeight")
        assert head.evaluate("e => e.clientHeight") <= 1000 < inner
        assert visit.errors == [] and visit.outside == []
    finally:
        visit.close()
