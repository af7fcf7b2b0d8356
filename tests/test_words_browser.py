"""The "Words, not WordPieces" toggle in the real browser: the heatmaps and bertviz's head view show words."""

from __future__ import annotations

import pytest

from harness.browser import CHROMIUM, CHROMIUM_MISSING, nav_to, wait_for_run

pytestmark = [pytest.mark.browser, pytest.mark.slow,
              pytest.mark.skipif(not CHROMIUM.exists(), reason=CHROMIUM_MISSING)]
TEXT = "the embeddings of unaffordable tokenizers"
FOCUSED_X_JS = """() => {
  const plots = [...document.querySelectorAll('[data-testid="stMain"] .js-plotly-plot')];
  const tokens = plots.map(gd => Array.from((gd._fullData && gd._fullData[0] && gd._fullData[0].x) || []))
                      .filter(x => x.some(l => typeof l === 'string' && /^\\d+: /.test(l)));
  return (tokens[0] || []).map(String);
}"""


def test_the_toggle_merges_pieces_on_the_heatmaps_and_in_bertviz(app_url, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"{app_url}/heatmaps?a={TEXT.replace(' ', '+')}&b=", wait_until="domcontentloaded")
        wait_for_run(page, 180)
        # The focused head is the plot whose axis holds tokens (the overview's holds heads); on a busy machine it
        # may be drawn after the run seems done.
        page.wait_for_function(f"() => ({FOCUSED_X_JS})().some(l => l.endsWith('##bed'))", timeout=120_000)
        before = page.evaluate(FOCUSED_X_JS)
        assert any(label.endswith("##bed") for label in before), before
        page.locator('section[data-testid="stSidebar"]').get_by_text("Words, not WordPieces").click()
        page.get_by_text("Words, not WordPieces:").first.wait_for(timeout=60_000)
        wait_for_run(page, 180)
        page.wait_for_function(f"() => ({FOCUSED_X_JS})().includes('2: embeddings')", timeout=120_000)
        after = page.evaluate(FOCUSED_X_JS)
        assert "2: embeddings" in after and len(after) < len(before), after
        assert "words=true" in page.url
        # The same toggle reaches bertviz's head view.
        nav_to(page, "bertviz views")
        frame_el = page.locator('iframe[title="bertviz head view"]')
        frame_el.wait_for(timeout=120_000)
        wait_for_run(page, 180)
        frame = frame_el.element_handle().content_frame()
        frame.wait_for_function("document.querySelectorAll('svg text').length > 5", timeout=60_000)
        texts = frame.evaluate("Array.from(document.querySelectorAll('svg text')).map(t => t.textContent)")
        assert "embeddings" in texts and not any(t.startswith("##") for t in texts), texts
        assert page.locator('[data-testid="stException"]').count() == 0
        assert not errors, errors
    finally:
        page.close()
