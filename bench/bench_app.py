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
  for the same attentions, beside ours (``attention_explorer.views``) when that module exists.
* **10 sessions**: one fresh server, the heatmaps page open in 1 then 10 browser sessions at 128
  tokens (each with its own text, custom encoder): the server's RSS for 1 and for 10 sessions.

Timings on a shared CPU are noisy: each is repeated (``--repeat``, default 3) and the median is
printed with the range. Needs /usr/bin/chromium.

Where the time goes: ``--profile FILE`` samples the server with py-spy; ``--profile-browser PATH``
records the page's JavaScript CPU profile over the head changes at the largest size (a .cpuprofile
for Chrome DevTools) and prints the busiest functions. ``--heatmaps-only`` skips the bertviz page
and raw bertviz's bytes, for quick runs.

One job a file: ``app_session.py`` (one browser session: submit a text, change the head, time the redraw),
``app_pages.py`` (the heatmaps and bertviz runs, raw bertviz's bytes), ``app_every_page.py`` (every page from a
link), ``app_profile.py`` (py-spy and the browser's CPU profile), ``app_common.py`` (the models as the sidebar's
requests, number formats); this file is the command line, the memory run and the report.
"""

from __future__ import annotations

import argparse
import statistics
import time

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from harness.browser import CHROMIUM, AppServer, open_chromium  # noqa: E402 - the one launcher
from harness.texts import text_of  # noqa: E402
from app_common import MODEL_PARAMS, mb, med  # noqa: E402
from app_every_page import bench_every_page, every_page_table  # noqa: E402
from app_pages import bench_pages  # noqa: E402
from app_profile import profile_summary  # noqa: E402
from app_session import open_page, wait_idle_figures  # noqa: E402


def bench_sessions(browser, n_sessions: int, n_tokens: int) -> dict:
    """A fresh server; RSS after one session, then after ``n_sessions`` (each its own text)."""
    server = AppServer()
    try:
        params = MODEL_PARAMS["custom 12x12x768"]
        rss_idle = server.rss_mb()
        contexts = []
        results = {"idle": rss_idle}
        for i in range(n_sessions):
            ctx, page, _ = open_page(browser, server.origin, "heatmaps", {**params, "text_b": "", "text_a": text_of(n_tokens, 500 + i)})
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
    parser.add_argument("--models", nargs="+", default=list(MODEL_PARAMS), choices=list(MODEL_PARAMS))
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
    parser.add_argument("--page", nargs="+", metavar="PAGE",
                        help="with --pages-only: only these pages (and heatmaps, the base of the ratios), e.g. causal home")
    parser.add_argument("--changes", type=int, default=1, help="picker changes per page in the every-page run (median)")
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
            page_rows = [] if args.no_pages else bench_every_page(browser, server, args.sizes, args.models,
                                                                             args.page, args.changes)
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
          "the same attentions; ours = attention_explorer.views (head view: one layer).")


if __name__ == "__main__":
    main()
