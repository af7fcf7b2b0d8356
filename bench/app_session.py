"""bench_app's one browser session: Playwright helpers that submit a text or change the head and time the redraw,
with the bytes received meanwhile."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
import urllib.parse

from app_common import N_FIGURES, TIMEOUT_MS
from app_profile import BrowserProfile

# -- browser-side helpers ------------------------------------------------------------------------
# A cheap fingerprint of every Plotly figure on the page: its data's size and a few sums. It changes
# when a figure is redrawn with new numbers.
FINGERPRINT_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => {
    if (!gd._fullData || !gd.querySelector('.main-svg')) return null;
    return gd._fullData.map(t => {
        const z = t.z, x = Array.from(t.x || []);
        if (!z) { let s = 0; const y = Array.from(t.y || []);  // bars and lines: their values
                  for (let i = 0; i < y.length; i++) s += (+y[i] || 0) * (i + 1); return x.length + ':' + s.toFixed(6); }
        const labels = x.slice(0, 3).join(',') + x.slice(-1);
        const rows = z.length, mid = z[Math.floor(rows / 2)] || [], first = z[0] || [];
        let s = 0; for (let i = 0; i < first.length; i++) s += (+first[i] || 0) * (i + 1);
        for (let i = 0; i < mid.length; i++) s += (+mid[i] || 0) * (i + 7);
        return rows + ':' + first.length + ':' + s.toFixed(6) + ':' + labels;
    }).join('|');
})"""
RUNNING_JS = """() => document.querySelector('[data-testid="stStatusWidget"]') !== null
    && /Running|Stop/i.test(document.querySelector('[data-testid="stStatusWidget"]').innerText)"""
# The moment of the user's own input, from the event itself: Playwright's click spends ~50 ms on
# actionability checks before the mouse goes down, which no user waits for.
ARM_INPUT_JS = """() => { window.__inputAt = null;
    for (const type of ['pointerdown', 'keydown'])
        document.addEventListener(type, e => { if (window.__inputAt === null) window.__inputAt = e.timeStamp; },
                                  {capture: true, once: true});
    return performance.now(); }"""
INPUT_AT_JS = "() => window.__inputAt"
PAINT_JS = """() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r(performance.now()))))"""


def wait_redrawn_js(before: list, n_figures: int, which: list[int] | None, must_text: str | None) -> str:
    """JS predicate: the script is idle, no element is stale, all figures are drawn, and the chosen
    figures' fingerprints differ from ``before``.

    Only the figures that must change are checked: a summary grid can be identical for two texts
    (a random-weight model at 512 tokens attends almost uniformly: every entropy rounds to 9.0000),
    and then Streamlit keeps it as it is.
    """
    import json

    return f"""() => {{
        const before = {json.dumps(before)}, which = {json.dumps(which)}, mustText = {json.dumps(must_text)};
        const status = document.querySelector('[data-testid="stStatusWidget"]');
        if (status && /Running|Stop/i.test(status.innerText)) return false;
        if (mustText && !document.body.innerText.includes(mustText)) return false;
        if (document.querySelector('[data-stale="true"]')) return false;
        const now = ({FINGERPRINT_JS})();
        if (now.length !== {n_figures} || now.some(f => f === null)) return false;
        const idx = which || now.map((_, i) => i);
        return idx.every(i => now[i] !== before[i]);
    }}"""


# -- one browser session -------------------------------------------------------------------------
@dataclass
class Meter:
    """Bytes the page received: websocket frames and HTTP response bodies."""

    ws_bytes: int = 0
    http_bytes: int = 0
    frames: int = 0
    pending: list = field(default_factory=list)
    frame_times: list = field(default_factory=list)  # time.perf_counter() of each frame since reset
    skip_static: bool = False  # count only what the page itself received, not Streamlit's or bertviz's files

    def attach(self, page) -> None:
        def on_ws(ws):
            ws.on("framereceived", self._frame)

        page.on("websocket", on_ws)
        page.on("response", lambda r: self.pending.append(r))

    def _frame(self, payload) -> None:
        self.frames += 1
        self.frame_times.append(time.perf_counter())
        self.ws_bytes += len(payload) if payload is not None else 0

    def settle(self) -> None:
        for r in self.pending:
            if self.skip_static and ("/static/" in r.url or r.url.endswith((".woff2", ".js", ".css"))):
                continue
            try:
                self.http_bytes += len(r.body())
            except Exception:  # noqa: BLE001 - a body that is gone (redirect, aborted) counts 0
                pass
        self.pending.clear()

    def reset(self) -> None:
        self.settle()
        self.ws_bytes = self.http_bytes = self.frames = 0
        self.frame_times = []

    def split(self, t0: float, t1: float) -> str:
        """Where the time went: first and last websocket frame before the paint (server), then the browser."""
        seen = [t for t in self.frame_times if t <= t1]
        if not seen:
            return "no frames"
        return f"frames at {seen[0] - t0:.2f}-{seen[-1] - t0:.2f} s, painted at {t1 - t0:.2f} s"

    @property
    def total(self) -> int:
        return self.ws_bytes + self.http_bytes


def open_page(browser, origin: str, path: str, params: dict[str, str]):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    meter = Meter()
    meter.attach(page)
    page.goto(f"{origin}/{path}?{urllib.parse.urlencode(params)}", wait_until="domcontentloaded")
    return context, page, meter


def wait_idle_figures(page, n_figures: int = N_FIGURES, timeout_ms: int = TIMEOUT_MS) -> None:
    page.wait_for_function(wait_redrawn_js([None] * n_figures, n_figures, None, None), polling=50,
                           timeout=timeout_ms)


def type_and_submit(page, meter: Meter, text: str) -> tuple[float, float]:
    """Type ``text`` into Sentence A, reset the meter and submit (Ctrl+Enter); return (the page's clock when the
    input listener was armed, ms; ``time.perf_counter()`` at the key press)."""
    box = page.locator('section[data-testid="stSidebar"] textarea[aria-label="Sentence A"]')
    box.fill(text)
    meter.reset()
    armed = page.evaluate(ARM_INPUT_JS)
    p0 = time.perf_counter()
    box.press("Control+Enter")
    return armed, p0


def submit_text(page, meter: Meter, text: str, n_tokens: int) -> tuple[float, int, str]:
    """Type new text into Sentence A and submit; return (seconds until every figure is redrawn, bytes)."""
    before = page.evaluate(FINGERPRINT_JS)
    armed, p0 = type_and_submit(page, meter, text)
    page.wait_for_function(wait_redrawn_js(before, N_FIGURES, [1], f"· {n_tokens} tokens"), polling=50,
                           timeout=TIMEOUT_MS)
    t1 = page.evaluate(PAINT_JS)
    t0 = page.evaluate(INPUT_AT_JS)
    p0 += (t0 - armed) / 1000  # the server's frames, timed from the same moment
    p1 = time.perf_counter()
    page.wait_for_timeout(300)  # late frames (e.g. the URL update) still count
    meter.settle()
    return (t1 - t0) / 1000, meter.total, meter.split(p0, p1)


_LAST_HEAD: dict[int, int] = {}  # page -> the head it shows (0 when opened)


def change_head(page, meter: Meter, head: int, layer: int = 0,
                profiler: BrowserProfile | None = None) -> tuple[float, int, str]:
    """Pick another head in the sidebar; return (seconds until the focused heatmap is redrawn, bytes)."""
    before = page.evaluate(FINGERPRINT_JS)
    combo = page.locator('section[data-testid="stSidebar"] input[role="combobox"][aria-label="Head"]')
    if _LAST_HEAD.get(id(page), 0) == head:  # the session kept this head from an earlier measurement
        head = head % 11 + 1
    _LAST_HEAD[id(page)] = head
    combo.click()
    combo.press("ArrowDown")  # opens the list without typing (typing can pick an option by itself)
    option = page.locator(f'[role="listbox"] [role="option"][data-key="{head}"]')
    option.wait_for()
    page.wait_for_function(f"() => !({RUNNING_JS})()", polling=50, timeout=TIMEOUT_MS)  # nothing started yet
    meter.reset()
    if profiler is not None:
        profiler.start()
    armed = page.evaluate(ARM_INPUT_JS)
    p0 = time.perf_counter()
    option.click()
    try:
        page.wait_for_function(wait_redrawn_js(before, N_FIGURES, [1], f"Layer {layer}, head {head}"), polling=50,
                               timeout=TIMEOUT_MS)
    except Exception:
        page.screenshot(path="/tmp/bench_app_fail.png", full_page=True)
        print("  before", before, "\n  now", page.evaluate(FINGERPRINT_JS), flush=True)
        raise
    t1 = page.evaluate(PAINT_JS)
    t0 = page.evaluate(INPUT_AT_JS)
    p0 += (t0 - armed) / 1000
    p1 = time.perf_counter()
    if profiler is not None:
        profiler.stop()
    page.wait_for_timeout(300)
    meter.settle()
    return (t1 - t0) / 1000, meter.total, meter.split(p0, p1)


def submit_text_bertviz(page, meter: Meter, text: str, n_tokens: int) -> tuple[float, int, str]:
    """On the bertviz page (head view): submit new text; seconds until the new view's SVG is drawn, bytes."""
    for frame in page.frames[1:]:
        try:
            frame.evaluate("window.__benchOld = true")
        except Exception:  # noqa: BLE001 - a frame that is going away
            pass
    armed, p0 = type_and_submit(page, meter, text)
    deadline = time.time() + TIMEOUT_MS / 1000
    drawn_js = "() => !window.__benchOld && document.querySelectorAll('svg *').length > 10"
    while True:
        page.wait_for_timeout(30)
        if time.time() > deadline:
            raise TimeoutError("the bertviz view did not draw")
        idle = page.evaluate(f"""() => {{
            const status = document.querySelector('[data-testid="stStatusWidget"]');
            if (status && /Running|Stop/i.test(status.innerText)) return false;
            return document.body.innerText.includes({f"· {n_tokens} tokens"!r})
                && !document.querySelector('[data-stale="true"]'); }}""")
        if not idle:
            continue
        done = False
        for frame in page.frames[1:]:
            try:
                done = done or frame.evaluate(drawn_js)
            except Exception:  # noqa: BLE001
                pass
        if done:
            break
    t1 = page.evaluate(PAINT_JS)
    t0 = page.evaluate(INPUT_AT_JS)
    p0 += (t0 - armed) / 1000
    p1 = time.perf_counter()
    page.wait_for_timeout(300)
    meter.settle()
    return (t1 - t0) / 1000, meter.total, meter.split(p0, p1)
