"""bench_app's every page from a link: each page at each size and model, opened from a URL, and its own picker."""

from __future__ import annotations

import itertools
import json
import statistics
import time
import urllib.parse

from harness.browser import AppServer
from harness.texts import DECODERS, text_of
from app_common import MODEL_PARAMS, MODEL_REQUESTS, N_FIGURES, TIMEOUT_MS, mb
from app_session import ARM_INPUT_JS, FINGERPRINT_JS, INPUT_AT_JS, PAINT_JS, Meter

# -- every page from a link ----------------------------------------------------------------------
# page path -> (figures it draws at least, the picker that the page's own figures depend on)
EVERY_PAGE = {
    "heatmaps": (3, ("sidebar", "Head")),
    "": (1, ("sidebar", "Head")),  # Home, the default page, lives at the root
    "causal": (6, ("sidebar", "Head")),
    "inside": (6, ("sidebar", "Head")),
    "bertviz": (0, ("sidebar", "Layer")),  # no Plotly figure: its iframe must draw (PAGE_READY_JS)
    "analysis_contexts": (3, ("sidebar", "Head")),
    "analysis_rollout": (2, ("slider", "Rollout up to layer")),
    "analysis_norms": (4, ("sidebar", "Head")),
    "analysis_head_stats": (1, ("select", "Statistic")),
    "analysis_masking": (3, ("select", "…or a whole layer")),
    "predictions": (2, ("select", "Position")),  # decoders only; its figures follow the logit lens's position
}
NOT_FOR = {"predictions": "encoder"}  # pages that only say they do not apply
DECODER_FIGURES = {"inside": 2}  # a decoder block's walk opens with its scores and weights (the encoder's with six)
WARM_UP_TOKENS = {False: 4, True: 2}  # "warm up" with [CLS]/[SEP] in an encoder, two BPE pieces in SmolLM2
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

    from model_core import Models, build_custom_model, build_trace

    from ui.loaders import cpu_threads  # the server's choice: half the cores

    torch.set_num_threads(cpu_threads())
    request = replace(MODEL_REQUESTS[label], text_a=text)
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


def use_picker(page, meter: Meter, picker: tuple[str, str], min_figures: int, option_index: int = 2) -> tuple[float, int]:
    """Change the page's own picker once (a list picker to its ``option_index``-th option); (seconds until its
    figures are redrawn and painted, bytes)."""
    kind, label = picker
    before = page.evaluate(FINGERPRINT_JS), page.evaluate(IFRAME_STAMP_JS)
    meter.reset()
    if kind == "slider":
        thumb = page.get_by_role("slider", name=label)
        thumb.focus()
        page.evaluate(ARM_INPUT_JS)  # the listener that records the input's time
        thumb.press("ArrowLeft")
    else:
        scope = page.locator('section[data-testid="stSidebar"]') if kind == "sidebar" else page.locator(
            '[data-testid="stMain"]')
        combo = scope.locator(f'input[role="combobox"][aria-label="{label}"]')
        combo.click()
        combo.press("ArrowDown")
        option = page.locator('[role="listbox"] [role="option"]').nth(option_index)
        option.wait_for()
        page.evaluate(ARM_INPUT_JS)  # the listener that records the input's time
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


def warm_up(context, origin: str, label: str, path: str = "heatmaps", n_tokens: int | None = None) -> None:
    """Open ``path`` (the heatmaps page unless told) on a short text ("warm up", or ``text_of(n_tokens)``: the
    contexts page draws nothing on a text without a repeated word), so that the model is loaded and Streamlit's
    JavaScript is in the browser's cache before anything is timed. The heatmaps page draws ``N_FIGURES`` figures (it
    waited for six, from before the four summary grids became one figure, and so timed out on every run)."""
    min_figures = N_FIGURES if path == "heatmaps" else EVERY_PAGE[path][0]
    if label in DECODERS:
        min_figures = DECODER_FIGURES.get(path, min_figures)
    text = text_of(n_tokens, 1, label) if n_tokens else "warm up"
    n_tokens = n_tokens or WARM_UP_TOKENS[label in DECODERS]
    warm = context.new_page()
    warm.goto(f"{origin}/{path}?{urllib.parse.urlencode({**MODEL_PARAMS[label], 'text_b': '', 'text_a': text})}")
    warm.wait_for_function(PAGE_READY_JS, arg=[min_figures, f"· {n_tokens} tokens"], polling=50, timeout=TIMEOUT_MS)
    warm.close()


def bench_every_page(browser, server: AppServer, sizes: list[int], models: list[str], only: list[str] | None = None,
                     changes: int = 1) -> list[dict]:
    """Each page opened from a link (a new text each time, so each open runs the forward pass), then its picker
    ``changes`` times (the median is reported); ``only`` names the pages to measure (the heatmaps page always runs,
    as the base of the ratios; "home" is the root page)."""
    rows = []
    variants = itertools.count(301)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    for label in models:
        warm_up(context, server.origin, label)
        for n in sizes:
            forward = forward_seconds(label, text_of(n, 300, label))
            for path, (min_figures, picker) in EVERY_PAGE.items():
                if NOT_FOR.get(path) == ("decoder" if label in DECODERS else "encoder"):
                    continue
                if only and path != "heatmaps" and (path or "home") not in only:
                    continue
                if label in DECODERS:
                    min_figures = DECODER_FIGURES.get(path, min_figures)
                params = {**MODEL_PARAMS[label], "text_b": "", "text_a": text_of(n, next(variants), label)}
                page, meter, seconds, size = open_link(context, server.origin, path, params, min_figures, n)
                tallest = page.evaluate(TALLEST_JS)
                try:
                    measured = [use_picker(page, meter, picker, min_figures, 2 + k % 2) for k in range(changes)]
                    change = statistics.median(m[0] for m in measured)
                    change_bytes = statistics.median(m[1] for m in measured)
                    if changes > 1:
                        print(f"  {label} {n} {path or 'home'}: changes " + ", ".join(f"{m[0]:.2f}" for m in measured) + " s",
                              flush=True)
                except Exception as exc:  # noqa: BLE001 - report it, keep measuring the other pages
                    print(f"  {label} {n} {path or 'home'}: picker failed ({type(exc).__name__}: {str(exc)[:200]})", flush=True)
                    change, change_bytes = float("nan"), 0
                page.close()
                row = {"model": label, "n": n, "page": path, "open_s": seconds, "bytes": size, "tallest_px": tallest,
                       "picker": picker[1], "change_s": change, "change_bytes": change_bytes, "forward_s": forward,
                       "rss_mb": server.rss_mb()}
                rows.append(row)
                print(f"  {label} {n:>3} {path or 'home':20s} open {seconds:5.2f} s {mb(size):>9} tallest {tallest:>5.0f} px · "
                      f"{picker[1]} {change:5.2f} s {mb(change_bytes):>9} · forward {forward:.2f} s · server RSS "
                      f"{row['rss_mb']:.0f} MB", flush=True)
    context.close()
    return rows


def every_page_table(rows: list[dict]) -> str:
    """One markdown table: every page, with its open time as a ratio to the heatmaps page's in the same run."""
    lines = ["| model | tokens | page | open from a link | × heatmaps page | × forward pass | bytes | tallest figure |"
             " picker | change | server RSS after |", "|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        base = next(x for x in rows if x["model"] == r["model"] and x["n"] == r["n"] and x["page"] == "heatmaps")
        lines.append(f"| {r['model']} | {r['n']} | {r['page'] or 'home'} | {r['open_s']:.2f} s | {r['open_s'] / base['open_s']:.2f} | "
                     f"{r['open_s'] / r['forward_s']:.1f} | {mb(r['bytes'])} | {r['tallest_px']:.0f} px | {r['picker']} | "
                     f"{r['change_s']:.2f} s | {r['rss_mb']:.0f} MB |")
    return "\n".join(lines)
