"""Benchmark the real app in headless Chromium: time and bytes per page, redraws, and memory per session.

Run: ``.venv/bin/python bench/bench_app.py`` (about 10 minutes on 2 cores; ``--quick`` for one repeat).

It starts ``streamlit run app.py`` on a free port (offline, no file watcher) and drives it with
Playwright. For the custom encoder at bert-base shape (12 layers x 12 heads, hidden 768, random
weights) and for the bundled BERT, at 13, 128 and 512 tokens:

* **heatmaps page**: the time from submitting new text in the sidebar (Ctrl+Enter) to every Plotly
  figure on the page being drawn with the new numbers (the overview, the focused head and the four
  summary grids: the script has finished, no element is stale, all six are drawn, the focused
  heatmap shows the new tokens, two animation frames have passed), and the bytes the browser received meanwhile (websocket frames plus HTTP
  response bodies). The text is new each time, so the time includes the forward pass.
* **layer/head change**: choosing another head in the sidebar (no new forward pass) until the
  focused heatmap is redrawn.
* **raw bertviz**: the bytes of bertviz's ``head_view`` and ``model_view`` (``html_action="return"``)
  for the same attentions, beside ours (``ui.bertviz_views``) when that module exists.
* **10 sessions**: one fresh server, the heatmaps page open in 1 then 10 browser sessions at 128
  tokens (each with its own text, custom encoder): the server's RSS for 1 and for 10 sessions.

Timings on a shared CPU are noisy: each is repeated (``--repeat``, default 3) and the median is
printed with the range. Needs /usr/bin/chromium.

Where the time goes: ``--profile FILE`` samples the server with py-spy; ``--profile-browser PATH``
records the page's JavaScript CPU profile over the head changes at the largest size (a .cpuprofile
for Chrome DevTools) and prints the busiest functions. ``--heatmaps-only`` skips the bertviz page
and raw bertviz's bytes, for quick runs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from browser_support import CHROMIUM, AppServer, open_chromium  # noqa: E402 - the one launcher
WORDS = ("the quick brown fox jumps over the lazy dog while a small bird sings in the old tree near the river "
         "and children play with a red ball on the green grass under the warm sun of a long summer day").split()
MODELS = {  # label -> query parameters that pick the model (custom: bert-base shape is the default)
    "custom 12x12x768": {"model": "custom", "layers": "12", "heads": "12", "hidden": "768"},
    "bundled BERT 6x12x384": {"model": "bert"},
}
N_FIGURES = 6  # heatmaps page: overview, focused head, four summary grids
TIMEOUT_MS = 120_000

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


# -- inputs --------------------------------------------------------------------------------------
def text_of(n_tokens: int, variant: int) -> str:
    """One sentence (no sentence B) of exactly ``n_tokens`` WordPiece tokens, [CLS] and [SEP] included.

    ``variant`` rotates the words, so every measurement runs a new forward pass.
    """
    words = n_tokens - 2
    return " ".join(WORDS[(i + 7 * variant) % len(WORDS)] for i in range(words))


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


def submit_text(page, meter: Meter, text: str, n_tokens: int) -> tuple[float, int, str]:
    """Type new text into Sentence A and submit; return (seconds until every figure is redrawn, bytes)."""
    before = page.evaluate(FINGERPRINT_JS)
    box = page.locator('section[data-testid="stSidebar"] textarea[aria-label="Sentence A"]')
    box.fill(text)
    meter.reset()
    armed = page.evaluate(ARM_INPUT_JS)
    p0 = time.perf_counter()
    box.press("Control+Enter")
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
    box = page.locator('section[data-testid="stSidebar"] textarea[aria-label="Sentence A"]')
    box.fill(text)
    meter.reset()
    armed = page.evaluate(ARM_INPUT_JS)
    p0 = time.perf_counter()
    box.press("Control+Enter")
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


# -- raw bertviz bytes ---------------------------------------------------------------------------
def bertviz_bytes(model_label: str, n_tokens: int) -> dict[str, int | None]:
    """Bytes of raw bertviz's head and model views for the same input, and of ours if it exists."""
    import torch
    from bertviz import head_view, model_view

    from model_core import TraceRequest, build_trace

    params = MODELS[model_label]
    if params["model"] == "bert":
        trace = build_trace(TraceRequest("bert", text_of(n_tokens, 0)))
    else:
        trace = build_trace(TraceRequest("custom", text_of(n_tokens, 0), num_layers=int(params["layers"]),
                                         num_heads=int(params["heads"]), hidden_size=int(params["hidden"])))
    attention = tuple(torch.from_numpy(trace.attentions[i].copy())[None] for i in range(trace.n_layers))
    tokens = list(trace.tokens)
    out: dict[str, int | None] = {
        "raw_head": len(head_view(attention, tokens, html_action="return").data.encode()),
        "raw_model": len(model_view(attention, tokens, html_action="return").data.encode()),
        "ours_head": None, "ours_model": None,
    }
    try:
        from ui import bertviz_views as bv

        out["ours_head"] = len(bv.head_view_html(trace, layers=[0]).html.encode())
        out["ours_model"] = len(bv.model_view_html(trace).html.encode())
    except Exception as exc:  # noqa: BLE001 - the bertviz module is someone else's work in progress
        print(f"  (ours bertviz unavailable: {type(exc).__name__}: {exc})", flush=True)
    return out


# -- the runs ------------------------------------------------------------------------------------
def profile_summary(path: Path, top: int = 25) -> str:
    """Inclusive share of the sampled time for the busiest functions of the app and its libraries."""
    import collections
    import re

    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        if any(("select" in f or "wait" in f or "poll" in f) for f in frames[-1:]):
            continue  # idle threads (event loop, worker queues)
        total += n
        seen = set()
        for f in frames:
            # "function (path/file.py:line)" -> "file.py:function"
            m = re.match(r"(.*?) \((.*?):\d+\)", f)
            name = f"{Path(m.group(2)).name}:{m.group(1)}" if m else f
            if name not in seen:
                seen.add(name)
                inclusive[name] += n
    if not total:
        return "no busy samples"
    keep = [(k, v) for k, v in inclusive.most_common() if re.search(
        r"^(app|heatmaps|figures|loaders|summary|trace|tracing|state|encoder|modeling_bert|_json|json|"
        r"basedatatypes|plotly_chart|forward_msg|websocket|app_session|script_runner|exec_code|"
        r"delta_generator|protobuf|module)\.py", k)]
    lines = [f"{100 * v / total:5.1f}%  {k}" for k, v in keep[:top]]
    return f"{total} busy samples at 50 Hz (inclusive share, busiest first):\n" + "\n".join(lines)


class BrowserProfile:
    """The page's JavaScript CPU profile (Chrome DevTools protocol) over the head changes it is started around."""

    def __init__(self, page, path: Path) -> None:
        self.cdp = page.context.new_cdp_session(page)
        self.cdp.send("Profiler.enable")
        self.cdp.send("Profiler.setSamplingInterval", {"interval": 200})  # microseconds
        self.path, self.profiles = path, []

    def start(self) -> None:
        self.cdp.send("Profiler.start")

    def stop(self) -> None:
        self.profiles.append(self.cdp.send("Profiler.stop")["profile"])

    def save_and_summarise(self, top: int = 25) -> str:
        """Write the profiles (open them in Chrome DevTools' Performance panel) and sum them up per change."""
        import collections
        import json

        self.path.write_text(json.dumps(self.profiles[-1] if len(self.profiles) == 1 else self.profiles))
        inclusive: collections.Counter = collections.Counter()
        total = 0.0
        for prof in self.profiles:
            nodes = {nd["id"]: nd for nd in prof["nodes"]}
            parent = {c: nd["id"] for nd in prof["nodes"] for c in nd.get("children", [])}
            spent: collections.Counter = collections.Counter()
            for sample, delta in zip(prof["samples"], prof["timeDeltas"][1:] + [0]):
                spent[sample] += delta
            for sample, us in spent.items():
                total += us
                seen, node = set(), sample
                while node is not None:
                    frame = nodes[node]["callFrame"]
                    script = frame["url"].rsplit("/", 1)[-1].split(".")[0]
                    name = (f"{frame['functionName'] or '(anonymous)'} "
                            f"{script}:{frame['lineNumber']}:{frame['columnNumber']}")
                    if name not in seen:
                        seen.add(name)
                        inclusive[name] += us
                    node = parent.get(node)
        n = max(1, len(self.profiles))
        lines = [f"{v / 1000 / n:7.1f} ms  {k}" for k, v in inclusive.most_common(top)]
        return (f"{n} head change(s), {total / 1000 / n:.0f} ms sampled each (from the click to the paint); "
                f"inclusive time per change, minified names (file:line:column):\n" + "\n".join(lines))


def med(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f} s"
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def mb(n: float | None) -> str:
    if n is None:
        return "pending"
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _repeat(repeat: int, what: str, measure) -> tuple[list[float], list[int]]:
    """Run ``measure`` (-> seconds, bytes, where the time went) ``repeat`` times, printing each run."""
    times, sizes = [], []
    for _ in range(repeat):
        seconds, size, split = measure()
        times.append(seconds)
        sizes.append(size)
        print(f"  {what} {seconds:.2f} s, {mb(size)} ({split})", flush=True)
    return times, sizes


def bench_pages(browser, server: AppServer, sizes: list[int], repeat: int, models: list[str],
                bertviz_page: bool = True, raw_bertviz: bool = True,
                browser_profile: Path | None = None) -> list[dict]:
    rows = []
    variants = itertools.count(101)  # a new text for every measurement, so each runs a forward pass
    for label in models:
        params = {**MODELS[label], "b": "", "a": text_of(13, 99)}
        context, page, meter = open_page(browser, server.origin, "heatmaps", params)
        wait_idle_figures(page)
        for n in sizes:
            times, sizes_b = _repeat(repeat, f"{label} {n} tokens: heatmaps page",
                                     lambda: submit_text(page, meter, text_of(n, next(variants)), n))
            profiler = None
            if browser_profile is not None and n == max(sizes):
                slug = label.split()[0]
                profiler = BrowserProfile(page, browser_profile.with_name(
                    f"{browser_profile.stem}-{slug}-{n}{browser_profile.suffix or '.cpuprofile'}"))
            picks = itertools.count()
            heads, head_bytes = _repeat(
                repeat, f"{label} {n} tokens: head change",
                lambda: change_head(page, meter, head=1 + next(picks) % 11, profiler=profiler))
            if profiler is not None:
                print(f"\n  browser profile of the head changes ({label}, {n} tokens) -> {profiler.path}\n"
                      + profiler.save_and_summarise(), flush=True)
            forward = forward_seconds(label, text_of(n, 0))
            viz = bertviz_bytes(label, n) if raw_bertviz else dict.fromkeys(
                ("raw_head", "raw_model", "ours_head", "ours_model"))
            rows.append({"model": label, "n": n, "times": times, "bytes": statistics.median(sizes_b), "forward": forward,
                         "head_times": heads, "head_bytes": statistics.median(head_bytes), **viz})
        context.close()
        if not bertviz_page:
            continue
        # The bertviz page (head view, the sidebar's layer, all heads), up to 128 tokens.
        context, page, meter = open_page(browser, server.origin, "bertviz", params)
        page.wait_for_selector("iframe", timeout=TIMEOUT_MS)
        for n in [n for n in sizes if n <= 128]:
            times, sizes_b = _repeat(repeat, f"{label} {n} tokens: bertviz head view page",
                                     lambda: submit_text_bertviz(page, meter, text_of(n, next(variants)), n))
            row = next(r for r in rows if r["model"] == label and r["n"] == n)
            row["bv_times"], row["bv_bytes"] = times, statistics.median(sizes_b)
        context.close()
    return rows


# -- every page from a link ----------------------------------------------------------------------
# page path -> (figures it draws at least, the picker that the page's own figures depend on)
EVERY_PAGE = {
    "heatmaps": (6, ("sidebar", "Head")),
    "": (1, ("sidebar", "Head")),  # Home, the default page, lives at the root
    "causal": (8, ("sidebar", "Head")),
    "inside": (6, ("sidebar", "Head")),
    "bertviz": (0, ("sidebar", "Layer")),  # no Plotly figure: its iframe must draw (PAGE_READY_JS)
    "analysis_contexts": (3, ("sidebar", "Head")),
    "analysis_rollout": (2, ("slider", "Rollout up to layer")),
    "analysis_norms": (4, ("sidebar", "Head")),
    "analysis_head_stats": (1, ("select", "Statistic")),
    "analysis_masking": (3, ("select", "…or a whole layer")),
}
PAGE_READY_JS = """([minFigures, mustText]) => {
    const status = document.querySelector('[data-testid="stStatusWidget"]');
    if (status && /Running|Stop/i.test(status.innerText)) return false;
    if (document.querySelector('[data-stale="true"]') || document.querySelector('[data-testid="stSpinner"]')) return false;
    if (mustText && !document.body.innerText.includes(mustText)) return false;
    const plots = Array.from(document.querySelectorAll('.js-plotly-plot'));
    if (plots.length < minFigures || plots.some(gd => !gd._fullData || !gd.querySelector('.main-svg'))) return false;
    if (mustText && location.pathname.endsWith('/bertviz') && !document.querySelector('iframe')) return false;
    for (const f of document.querySelectorAll('iframe')) {
        const doc = f.contentDocument;
        if (!doc || doc.querySelectorAll('svg *').length < 10) return false;
    }
    return true;
}"""
TALLEST_JS = """() => Math.max(0, ...Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => gd._fullLayout ?
    gd._fullLayout.height : 0), ...Array.from(document.querySelectorAll('iframe')).map(f => f.getBoundingClientRect().height))"""
IFRAME_STAMP_JS = """() => Array.from(document.querySelectorAll('iframe')).map(f => {
    if (!f.contentDocument) return ''; const w = f.contentWindow; if (!w.__stamp) w.__stamp = Math.random(); return w.__stamp; }).join()"""


def forward_seconds(label: str, text: str) -> float:
    """The trace (tokenise + forward pass + the AttentionTrace) of ``text`` in this process, the model loaded
    beforehand, as the app's cached model is, with the server's number of torch threads (median of 3)."""
    import functools
    from dataclasses import replace

    import torch

    from model_core import Models, TraceRequest, build_custom_model, build_trace

    from ui.loaders import cpu_threads  # the server's choice: half the cores

    torch.set_num_threads(cpu_threads())
    params = MODELS[label]
    if params["model"] == "bert":
        request = TraceRequest("bert", text)
    else:
        request = TraceRequest("custom", text, num_layers=int(params["layers"]), num_heads=int(params["heads"]),
                               hidden_size=int(params["hidden"]))
    models = Models(custom=functools.lru_cache(maxsize=1)(build_custom_model))  # built once, as the app caches it
    build_trace(replace(request, text_a="warm up"), models=models)  # loads the model
    times = []
    for _ in range(3):
        start = time.perf_counter()
        build_trace(request, models=models)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def open_link(context, origin: str, path: str, params: dict, min_figures: int, n_tokens: int):
    """Open a shared link to a page in a new tab; (page, meter, seconds until every figure is drawn, bytes).

    The browser context is shared, so Streamlit's own JavaScript comes from its cache, as for anyone who has
    opened the app before; the bytes are what the page itself received (websocket frames and HTTP bodies other
    than static files).
    """
    page = context.new_page()
    meter = Meter(skip_static=True)
    meter.attach(page)
    start = time.perf_counter()
    page.goto(f"{origin}/{path}?{urllib.parse.urlencode(params)}", wait_until="commit")
    page.wait_for_function(PAGE_READY_JS, arg=[min_figures, f"· {n_tokens} tokens"], polling=50, timeout=TIMEOUT_MS)
    seconds = time.perf_counter() - start
    page.wait_for_timeout(300)
    meter.settle()
    return page, meter, seconds, meter.total


def use_picker(page, meter: Meter, picker: tuple[str, str], min_figures: int) -> tuple[float, int]:
    """Change the page's own picker once; (seconds until its figures are redrawn and painted, bytes)."""
    kind, label = picker
    before = page.evaluate(FINGERPRINT_JS), page.evaluate(IFRAME_STAMP_JS)
    meter.reset()
    if kind == "slider":
        thumb = page.get_by_role("slider", name=label)
        thumb.focus()
        armed = page.evaluate(ARM_INPUT_JS)
        thumb.press("ArrowLeft")
    else:
        scope = page.locator('section[data-testid="stSidebar"]') if kind == "sidebar" else page.locator(
            '[data-testid="stMain"]')
        combo = scope.locator(f'input[role="combobox"][aria-label="{label}"]')
        combo.click()
        combo.press("ArrowDown")
        option = page.locator('[role="listbox"] [role="option"]').nth(2)
        option.wait_for()
        armed = page.evaluate(ARM_INPUT_JS)
        option.click()
    page.wait_for_function(
        f"""() => {{ const before = {json.dumps(before[0])}, frames = {json.dumps(before[1])};
            if (!({PAGE_READY_JS})([{min_figures}, null])) return false;
            const now = ({FINGERPRINT_JS})(), stamps = ({IFRAME_STAMP_JS})();
            return now.some((f, i) => f !== before[i]) || (frames !== '' && stamps !== frames); }}""",
        polling=50, timeout=TIMEOUT_MS)
    t1 = page.evaluate(PAINT_JS)
    t0 = page.evaluate(INPUT_AT_JS)
    page.wait_for_timeout(300)
    meter.settle()
    return (t1 - t0) / 1000, meter.total


def bench_every_page(browser, server: AppServer, sizes: list[int], models: list[str]) -> list[dict]:
    """Each page opened from a link (a new text each time, so each open runs the forward pass), then its picker."""
    rows = []
    variants = itertools.count(301)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    for label in models:
        warm = context.new_page()  # the model loaded and Streamlit's JavaScript in the cache
        warm.goto(f"{server.origin}/heatmaps?{urllib.parse.urlencode({**MODELS[label], 'b': '', 'a': 'warm up'})}")
        warm.wait_for_function(PAGE_READY_JS, arg=[6, "· 4 tokens"], polling=50, timeout=TIMEOUT_MS)
        warm.close()
        for n in sizes:
            forward = forward_seconds(label, text_of(n, 300))
            for path, (min_figures, picker) in EVERY_PAGE.items():
                params = {**MODELS[label], "b": "", "a": text_of(n, next(variants))}
                page, meter, seconds, size = open_link(context, server.origin, path, params, min_figures, n)
                tallest = page.evaluate(TALLEST_JS)
                try:
                    change, change_bytes = use_picker(page, meter, picker, min_figures)
                except Exception as exc:  # noqa: BLE001 - report it, keep measuring the other pages
                    print(f"  {label} {n} {path or 'home'}: picker failed ({type(exc).__name__}: {str(exc)[:200]})", flush=True)
                    change, change_bytes = float("nan"), 0
                page.close()
                row = {"model": label, "n": n, "page": path, "open_s": seconds, "bytes": size, "tallest_px": tallest,
                       "picker": picker[1], "change_s": change, "change_bytes": change_bytes, "forward_s": forward}
                rows.append(row)
                print(f"  {label} {n:>3} {path or 'home':20s} open {seconds:5.2f} s {mb(size):>9} tallest {tallest:>5.0f} px · "
                      f"{picker[1]} {change:5.2f} s {mb(change_bytes):>9} · forward {forward:.2f} s", flush=True)
    context.close()
    return rows


def every_page_table(rows: list[dict]) -> str:
    """One markdown table: every page, with its open time as a ratio to the heatmaps page's in the same run."""
    lines = ["| model | tokens | page | open from a link | × heatmaps page | × forward pass | bytes | tallest figure |"
             " picker | change |", "|---|---:|---|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        base = next(x for x in rows if x["model"] == r["model"] and x["n"] == r["n"] and x["page"] == "heatmaps")
        lines.append(f"| {r['model']} | {r['n']} | {r['page'] or 'home'} | {r['open_s']:.2f} s | {r['open_s'] / base['open_s']:.2f} | "
                     f"{r['open_s'] / r['forward_s']:.1f} | {mb(r['bytes'])} | {r['tallest_px']:.0f} px | {r['picker']} | "
                     f"{r['change_s']:.2f} s |")
    return "\n".join(lines)


def bench_sessions(browser, n_sessions: int, n_tokens: int) -> dict:
    """A fresh server; RSS after one session, then after ``n_sessions`` (each its own text)."""
    server = AppServer()
    try:
        params = MODELS["custom 12x12x768"]
        rss_idle = server.rss_mb()
        contexts = []
        results = {"idle": rss_idle}
        for i in range(n_sessions):
            ctx, page, _ = open_page(browser, server.origin, "heatmaps", {**params, "b": "", "a": text_of(n_tokens, 500 + i)})
            wait_idle_figures(page)
            contexts.append(ctx)
            time.sleep(1.0)
            results[i + 1] = server.rss_mb()
            print(f"  {i + 1} session(s): server RSS {results[i + 1]:.0f} MB", flush=True)
        for ctx in contexts:
            ctx.close()
        return results
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[13, 128, 512])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--sessions", type=int, default=10, help="0 skips the memory run")
    parser.add_argument("--quick", action="store_true", help="one repeat")
    parser.add_argument("--heatmaps-only", action="store_true",
                        help="only the heatmaps page and head changes: no bertviz page, no raw bertviz bytes")
    parser.add_argument("--profile", type=Path, help="sample the server with py-spy into this file and summarise it")
    parser.add_argument("--profile-browser", type=Path, metavar="PATH",
                        help="record the page's JavaScript CPU profile over the head changes at the largest size "
                             "(PATH-<model>-<tokens>.cpuprofile, for Chrome DevTools) and summarise it")
    parser.add_argument("--pages-only", action="store_true",
                        help="only every page opened from a link and its own picker (with the forward pass)")
    parser.add_argument("--no-pages", action="store_true", help="skip the every-page run")
    args = parser.parse_args()
    if args.quick:
        args.repeat = 1
    if not os.path.exists(CHROMIUM):
        sys.exit(f"needs {CHROMIUM}")
    print(f"machine: {os.cpu_count()} CPUs, no GPU, shared with other jobs (load average "
          f"{os.getloadavg()[0]:.1f}); medians of {args.repeat} runs", flush=True)
    with open_chromium() as browser:
        server = AppServer()
        try:
            if args.profile:
                server.start_profile(args.profile)
            page_rows = [] if args.no_pages else bench_every_page(browser, server, args.sizes, args.models)
            if args.pages_only:
                print("\n" + every_page_table(page_rows))
                return
            rows = bench_pages(browser, server, args.sizes, args.repeat, args.models,
                               bertviz_page=not args.heatmaps_only and (ROOT / "pages/bertviz.py").exists(),
                               raw_bertviz=not args.heatmaps_only, browser_profile=args.profile_browser)
        finally:
            server.stop()
        sessions = bench_sessions(browser, args.sessions, 128) if args.sessions else None
        browser.close()

    if page_rows:
        print("\n" + every_page_table(page_rows))
    print()
    print("| model | tokens | heatmaps page: time | forward pass | × forward | bytes received | head change: time |"
          " bytes |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['n']} | {med(r['times'])} | {r['forward']:.2f} s | "
              f"{statistics.median(r['times']) / r['forward']:.1f} | {mb(r['bytes'])} | {med(r['head_times'])} | "
              f"{mb(r['head_bytes'])} |")
    print()
    print("| model | tokens | bertviz page (head view): time | bytes received | ours: head view HTML | "
          "raw bertviz head_view | ratio | ours: model view HTML | raw model_view |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if r["raw_head"] is None:
            continue
        ratio = f"1/{r['raw_head'] / r['ours_head']:.0f}" if r["ours_head"] else "pending"
        print(f"| {r['model']} | {r['n']} | {med(r.get('bv_times', []))} | "
              f"{mb(r['bv_bytes']) if 'bv_bytes' in r else '-'} | {mb(r['ours_head'])} | {mb(r['raw_head'])} | "
              f"{ratio} | {mb(r['ours_model'])} | {mb(r['raw_model'])} |")
    if args.profile and args.profile.exists():
        print("\nserver profile (py-spy):\n" + profile_summary(args.profile))
    if sessions:
        one, last = sessions[1], sessions[max(k for k in sessions if k != "idle")]
        print(f"\nsessions (custom 12x12x768, 128 tokens, own text each): server RSS idle {sessions['idle']:.0f} MB, "
              f"1 session {one:.0f} MB, {args.sessions} sessions {last:.0f} MB = {last / one:.2f}x one session")
    print("\ntime = Ctrl+Enter in Sentence A -> every figure redrawn and painted (forward pass included); "
          "bytes = websocket frames + HTTP bodies received in that time; head change = another head in the "
          "sidebar -> focused heatmap redrawn. Raw bertviz = head_view/model_view(html_action='return') HTML for "
          "the same attentions; ours = ui.bertviz_views (head view: one layer).")


if __name__ == "__main__":
    main()
