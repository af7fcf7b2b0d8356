"""The Attention heatmaps page on a long prompt (SmolLM2-135M, compact form) in headless Chromium: opened from a link
(the compact trace built by the server), a head change, a window change; bytes received; the tallest figure; and
the compact trace's own time in a child process with the same threads, for the ratio. Screenshots in screenshots/.

Usage: python bench/bench_compact_page.py [--sizes 1024 4096] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from harness.browser import AppServer, open_chromium  # noqa: E402

SHOTS = ROOT / "screenshots"
PAGE = "heatmaps"
# Each view the page draws: overview, pooled head, first-token share, window, four statistics.
N_FIGURES = 8
FIGURES_JS = """() => Array.from(document.querySelectorAll('[data-testid="stMain"] .js-plotly-plot'))
  .map(p => p.getBoundingClientRect().height)"""
BUSY = '[data-testid="stStatusWidget"], [data-testid="stSpinner"], [data-testid="stProgress"]'


def prompt(n: int) -> str:
    """A team-written prompt of exactly ``n`` SmolLM2 tokens (bench_compact's field notes)."""
    from transformers import AutoTokenizer

    from bench_compact import long_text
    from model_core.models.bundled import ensure_bundled_decoder

    tok = AutoTokenizer.from_pretrained(ensure_bundled_decoder())
    ids = tok(long_text(n), add_special_tokens=False)["input_ids"][:n]
    return tok.decode(ids)


def trace_seconds(n: int, threads: int) -> float:
    out = subprocess.run([sys.executable, str(ROOT / "bench/bench_compact.py"), "--child", "compact", str(n)],
                         capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "AE_TORCH_THREADS": str(threads)})
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


class Bytes:
    def __init__(self, page) -> None:
        self.n = 0
        page.on("websocket", lambda ws: ws.on("framereceived", self._frame))

    def _frame(self, payload) -> None:
        self.n += len(payload) if payload is not None else 0


def settled(page, n_figures: int, timeout_s: float) -> float:
    """Seconds until the page shows ``n_figures`` figures and nothing runs for 1 s (the quiet second excluded)."""
    t0 = time.perf_counter()
    quiet = None
    while time.perf_counter() - t0 < timeout_s:
        busy = page.locator(BUSY).count() > 0
        ready = len(page.evaluate(FIGURES_JS)) >= n_figures and not busy
        if ready and quiet is None:
            quiet = time.perf_counter()
        elif not ready:
            quiet = None
        elif time.perf_counter() - quiet >= 1.0:
            return quiet - t0
        page.wait_for_timeout(50)
    raise TimeoutError(f"the page did not settle in {timeout_s} s")


def change(page, bytes_: Bytes, act, expect_text: str, prepare=None) -> tuple[float, int]:
    """Seconds from ``act()`` until ``expect_text`` shows and nothing has run since; bytes received.

    ``prepare()`` runs first, untimed: opening the head list, as bench_app times a head change from the click on
    the new head. The change ends at the later of the text showing and the start of the half second of quiet that
    confirms it (not counted), so the next change starts on a still page: a change's tail is never timed as the
    next one's.
    """
    if prepare is not None:
        prepare()
    bytes_.n = 0
    t0 = time.perf_counter()
    act()
    page.get_by_text(expect_text).first.wait_for(timeout=120_000)
    shown = time.perf_counter()
    quiet = None
    while quiet is None or time.perf_counter() - quiet < 0.5:
        if page.locator(BUSY).count() > 0:
            quiet = None
        elif quiet is None:
            quiet = time.perf_counter()
        page.wait_for_timeout(20)
    return max(shown, quiet) - t0, bytes_.n


def shoot(page, path: Path) -> None:
    """The whole page: Streamlit scrolls inside its own container, so the viewport is made as tall as the page."""
    height = page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    page.set_viewport_size({"width": 1400, "height": min(int(height) + 100, 12000)})
    page.wait_for_timeout(1500)
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": 1400, "height": 1000})


def open_head_list(page, head: int):
    """Open the sidebar's head list; the option of ``head``, to click."""
    combo = page.locator('section[data-testid="stSidebar"] input[role="combobox"][aria-label="Head"]')
    combo.click()
    combo.press("ArrowDown")
    option = page.locator(f'[role="listbox"] [role="option"][data-key="{head}"]')
    option.wait_for()
    return option


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    SHOTS.mkdir(exist_ok=True)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; torch threads {args.threads}",
          flush=True)
    rows = []
    server = AppServer(extra_env={"AE_TORCH_THREADS": str(args.threads)})
    try:
        with open_chromium() as browser:
            warm = browser.new_page()
            warm.goto(f"{server.origin}/?model=pretrained&model_id=bundled%3ASmolLM2-135M-Instruct&a=warm")
            settled(warm, 1, 300)
            warm.close()
            for n in args.sizes:
                trace_s = trace_seconds(n, args.threads)
                text = prompt(n)
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                received = Bytes(page)
                params = {"model": "pretrained", "model_id": "bundled:SmolLM2-135M-Instruct", "a": text, "b": ""}
                t0 = time.perf_counter()
                page.goto(f"{server.origin}/{PAGE}?{urllib.parse.urlencode(params)}", wait_until="domcontentloaded")
                settled(page, N_FIGURES, 900)
                open_s = time.perf_counter() - t0 - 1.0  # the quiet second that confirms it is done
                open_bytes = received.n
                heights = page.evaluate(FIGURES_JS)
                shoot(page, SHOTS / f"compact_heatmaps_{n}.png")
                # Three of each, the median reported (one change varies by 0.2-0.3 s with the machine).
                options = {}
                heads = [change(page, received, lambda h=h: options[h].click(), f"Layer 0, head {h}",
                                prepare=lambda h=h: options.__setitem__(h, open_head_list(page, h))) for h in (6, 3, 7)]
                head_s, head_bytes = sorted(heads)[1]
                slider = page.get_by_role("slider").first
                # The window opens on the last 128 queries; each step moves its first query one to the left.
                windows = [change(page, received, lambda: slider.press("ArrowLeft"), f"Queries {n - 128 - step}–",
                                  prepare=slider.focus) for step in (1, 2, 3)]
                window_s, window_bytes = sorted(windows)[1]
                print(f"  head changes {[round(h[0], 2) for h in heads]} s, window changes "
                      f"{[round(w[0], 2) for w in windows]} s", flush=True)
                shoot(page, SHOTS / f"compact_heatmaps_{n}_head6.png")
                rows.append(dict(n=n, trace=trace_s, open=open_s, open_bytes=open_bytes, tallest=max(heights),
                                 head=head_s, head_bytes=head_bytes, window=window_s, window_bytes=window_bytes,
                                 rss=server.rss_mb()))
                print(f"  {n}: {rows[-1]}", flush=True)
                page.close()
    finally:
        server.stop()
    print("\n| tokens | compact trace | page from a link | × trace | sent | tallest figure | head change | sent | "
          "window change | server RSS |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['n']} | {r['trace']:.1f} s | {r['open']:.1f} s | {r['open'] / r['trace']:.2f} | "
              f"{r['open_bytes'] / 1e6:.2f} MB | {r['tallest']:.0f} px | {r['head']:.2f} s | "
              f"{r['head_bytes'] / 1e3:.0f} kB | {r['window']:.2f} s | {r['rss']:.0f} MB |")


if __name__ == "__main__":
    main()
