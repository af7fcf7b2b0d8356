"""Many users at once: N browser tabs open the heatmaps page together, each with its own text, on one server.

Run: ``.venv/bin/python bench/bench_users.py [--users 8] [--tokens 400] [--max-runs 1 8] [--served] [--remote]
[--profile]``

For each ``--max-runs`` value (passed to a fresh server as AE_MAX_RUNS) the bench starts the app (``harness.browser``),
loads SmolLM2 with one short text, then opens ``--users`` tabs (one browser context, warmed by that first page, as a
returning user's cache; ``--fresh-contexts``: an empty context each) on the heatmaps page at once, each with a text of
``--tokens`` tokens that no other tab has (so every tab runs a pass). It reports whether every tab drew, each tab's
wait from its link to its drawn page (its three figures drawn, the script idle: the page records the moment itself),
the median and the slowest wait and their ratio, and the server's RSS (its process and children, sampled every
0.2 s) at idle and at its peak. ``--served`` also times when the last message of each tab's run reached it: the
browser runs on the server's 2 cores here, so the drawn waits include its own queue of 8 pages to draw, which a
remote user's browser does not add; ``--remote`` times such users (``harness.protocol``: each speaks Streamlit's
websocket protocol from this process and counts as drawn when its page's run has delivered the page), with no browser
on the server's cores at all. ``--profile``: the tabs share a persistent profile, as a returning user's browser
does, whose disk cache also keeps V8's compiled code (a tab then boots in about half the CPU). Issue 32's targets at 8 users: every tab draws, peak RSS <= 3 GB, median wait
<= 0.7x the slowest.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import psutil  # noqa: E402

from app_common import MODEL_PARAMS, N_FIGURES  # noqa: E402
from app_session import wait_redrawn_js  # noqa: E402
from harness.browser import AppServer, open_chromium, open_chromium_profile  # noqa: E402
from harness.protocol import ProtocolUser, run_users  # noqa: E402
from harness.texts import text_of  # noqa: E402

MODEL = "SmolLM2-135M decoder 30x9"
SAMPLE_S = 0.2
TAB_TIMEOUT_S = 600
TARGET_PEAK_MB = 3000
TARGET_RATIO = 0.7
WATCH_MS = 100
COLLECT_S = 0.5


class RssSampler:
    """The RSS of a process and its children, every ``SAMPLE_S`` seconds in a thread, until ``stop``."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak_mb = 0.0
        self.samples: list[tuple[float, float]] = []  # (time.perf_counter(), MB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def rss_mb(self) -> float:
        total = 0
        for p in [self.process, *self.process.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:  # a child that just ended
                pass
        return total / 2**20

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                mb = self.rss_mb()
            except psutil.Error:  # the server is gone
                return
            self.samples.append((time.perf_counter(), mb))
            self.peak_mb = max(self.peak_mb, mb)
            self._stop.wait(SAMPLE_S)

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_mb


@dataclass
class Tab:
    """One user's tab: its page, when its link was opened, and its wait until the page was drawn."""

    index: int
    page: object
    opened: float = 0.0
    wait_s: float | None = None
    rss_mb: float | None = None  # the server's RSS when this tab had drawn
    error: str = ""
    frames: list = field(default_factory=list)  # when each websocket message from the server reached the tab

    def served_s(self) -> float | None:
        """From the link to the last server message before the page was drawn: the server's run delivered, before
        the browser's own drawing (which, on the server's cores, is the bench's, not a remote user's)."""
        if self.wait_s is None:
            return None
        drawn = self.opened + self.wait_s
        before = [t for t in self.frames if t <= drawn]
        return (max(before) if before else drawn) - self.opened


def page_query(text: str) -> dict[str, str]:
    """The heatmaps page's link parameters for SmolLM2 on ``text``."""
    return {**MODEL_PARAMS[MODEL], "text_b": "", "text_a": text}


def page_url(origin: str, text: str) -> str:
    return f"{origin}/heatmaps?{urllib.parse.urlencode(page_query(text))}"


def drawn_js(n_tokens: int) -> str:
    """True once the heatmaps page is drawn for this text: every figure drawn, nothing stale, the script idle."""
    return wait_redrawn_js([None] * N_FIGURES, N_FIGURES, None, f"· {n_tokens} tokens")


def watch_js(n_tokens: int) -> str:
    """An init script: the page checks itself every WATCH_MS and keeps, in ``window.__aeDrawnAt``, the epoch
    milliseconds at which it was first drawn for this text (the same conditions as ``drawn_js``).

    The check runs in the page and reads ``textContent``, which needs no layout: a check from the bench's loop
    would wait its turn behind the other tabs' round trips, and ``innerText`` forces a layout of the whole page
    at every call, work that 8 busy tabs on the server's 2 cores do not have to spare.
    """
    import json

    return f"""(() => {{
        const mustText = {json.dumps(f"· {n_tokens} tokens")};
        const drawn = () => {{
            const status = document.querySelector('[data-testid="stStatusWidget"]');
            if (status && /Running|Stop/i.test(status.textContent)) return false;
            if (document.querySelector('[data-stale="true"]')) return false;
            const plots = document.querySelectorAll('.js-plotly-plot');
            if (plots.length !== {N_FIGURES}) return false;
            for (const gd of plots) if (!gd._fullData || !gd.querySelector('.main-svg')) return false;
            const sidebar = document.querySelector('[data-testid="stSidebar"]') || document.body;
            return !!sidebar && sidebar.textContent.includes(mustText);
        }};
        window.__aeDrawnAt = null;
        const timer = setInterval(() => {{
            if (window.__aeDrawnAt === null && drawn()) {{ window.__aeDrawnAt = Date.now(); clearInterval(timer); }}
        }}, {WATCH_MS});
    }})();"""


def new_context(browser):
    return browser.new_context(viewport={"width": 1400, "height": 1000})


def warm_up(context, origin: str) -> None:
    """Load the model, and Streamlit's JavaScript into ``context``'s cache, with a short text."""
    page = context.new_page()
    page.goto(page_url(origin, text_of(12, 37, MODEL)), wait_until="domcontentloaded")
    page.wait_for_function(drawn_js(12), polling=100, timeout=TAB_TIMEOUT_S * 1000)
    page.close()


def open_tabs(browser, origin: str, users: int, n_tokens: int, first_variant: int, sampler: RssSampler,
              shared, served: bool = False) -> list[Tab]:
    """Open every tab's link at once (each goto returns when its request is sent), then wait until every tab drew.

    A tab's wait runs from just before its link is opened to the moment its own page saw itself drawn
    (``watch_js``); this loop only collects those moments, every ``COLLECT_S``.
    """
    tabs = []
    if shared is not None:
        shared.add_init_script(watch_js(n_tokens))
    for i in range(users):
        context = shared or new_context(browser)
        if shared is None:
            context.add_init_script(watch_js(n_tokens))
        tab = Tab(i, context.new_page())
        if served:  # every message's bytes pass through Playwright's driver to this process: CPU the tabs lack
            tab.page.on("websocket", lambda ws, tab=tab: ws.on(
                "framereceived", lambda _payload, tab=tab: tab.frames.append(time.time())))
        tabs.append(tab)
    for tab in tabs:
        tab.opened = time.time()
        tab.page.goto(page_url(origin, text_of(n_tokens, first_variant + tab.index, MODEL)), wait_until="commit")
    deadline = time.time() + TAB_TIMEOUT_S
    pending = list(tabs)
    while pending and time.time() < deadline:
        for tab in list(pending):
            try:
                drawn_at = tab.page.evaluate("() => window.__aeDrawnAt")
            except Exception as exc:  # noqa: BLE001 - a page still navigating; a crash shows as a timeout
                tab.error = f"{type(exc).__name__}: {str(exc)[:120]}"
                continue
            if drawn_at is not None:
                tab.wait_s = drawn_at / 1000 - tab.opened
                tab.rss_mb = sampler.rss_mb()
                pending.remove(tab)
        tabs[0].page.wait_for_timeout(COLLECT_S * 1000)  # Playwright delivers the frames' events meanwhile
    for tab in pending:
        tab.error = tab.error or f"not drawn after {TAB_TIMEOUT_S} s"
    return tabs


def open_remote(origin: str, users: int, n_tokens: int, first_variant: int, sampler: RssSampler) -> list[Tab]:
    """``users`` remote users (``harness.protocol``: Streamlit's websocket protocol, no browser on this machine) open
    their links at once; a user's wait ends when its page's run has finished, and it counts as drawn when that run
    delivered the page's figures and the sidebar's token count."""
    people = [ProtocolUser(origin, "heatmaps", page_query(text_of(n_tokens, first_variant + i, MODEL)))
              for i in range(users)]
    watcher = threading.Thread(target=_rss_when_served, args=(people, sampler), daemon=True)
    watcher.start()
    run_users(people, TAB_TIMEOUT_S)
    watcher.join()
    tabs = []
    for i, person in enumerate(people):
        tab = Tab(i, None, opened=person.opened, wait_s=person.wait_s, rss_mb=person.rss_mb, error=person.error)
        drew = person.figures == N_FIGURES and any(f"· {n_tokens} tokens" in text for text in person.texts)
        if tab.wait_s is not None and not drew:
            tab.wait_s, tab.error = None, tab.error or f"run ended without the page ({person.figures} figures)"
        tabs.append(tab)
    return tabs


def _rss_when_served(people: list[ProtocolUser], sampler: RssSampler) -> None:
    """Note the server's RSS as each remote user is served (the browser tabs note theirs in ``open_tabs``)."""
    deadline = time.time() + TAB_TIMEOUT_S
    while time.time() < deadline and any(p.rss_mb is None and not p.error for p in people):
        for person in people:
            if person.wait_s is not None and person.rss_mb is None:
                person.rss_mb = sampler.rss_mb()
        time.sleep(0.05)


def warm_up_remote(origin: str) -> None:
    """Load the model with a short text, as ``warm_up`` does, through the protocol."""
    person = run_users([ProtocolUser(origin, "heatmaps", page_query(text_of(12, 37, MODEL)))], TAB_TIMEOUT_S)[0]
    if person.wait_s is None:
        raise RuntimeError(f"the warm-up page was not served: {person.error}")


def run_once(browser, users: int, n_tokens: int, max_runs: int, first_variant: int, log_dir: Path,
             fresh_contexts: bool = False, served: bool = False, profile=None) -> dict:
    """One fresh server with AE_MAX_RUNS=``max_runs``: warm it up, then ``users`` tabs at once.

    The tabs share one browser context, warmed by the warm-up page, so each loads Streamlit's JavaScript from its
    cache, as a returning user's browser does (the scripts are ~10 MB, which a tab otherwise fetches, parses and
    compiles on the server's own cores); ``fresh_contexts`` gives each tab an empty context of its own instead.
    With ``browser`` None the users are remote (``open_remote``): no browser shares the server's cores. ``profile``
    (a persistent context, ``open_chromium_profile``) is the tabs' one context instead: a returning user's browser,
    whose disk cache keeps V8's compiled code as well as the scripts.
    """
    server = AppServer(log_dir / f"server_max_runs_{max_runs}.log", extra_env={"AE_MAX_RUNS": str(max_runs)})
    shared = profile or (None if fresh_contexts or browser is None else new_context(browser))
    try:
        if browser is None:
            warm_up_remote(server.origin)
        else:
            warm_up(shared or new_context(browser), server.origin)
        time.sleep(2.0)  # the warm-up's garbage collected (ui.loaders.collect_after_run)
        sampler = RssSampler(server.proc.pid)
        idle_mb = sampler.rss_mb()
        t0 = time.perf_counter()
        if browser is None:
            tabs = open_remote(server.origin, users, n_tokens, first_variant, sampler)
        else:
            tabs = open_tabs(browser, server.origin, users, n_tokens, first_variant, sampler, shared, served)
        total_s = max(t.opened + t.wait_s for t in tabs if t.wait_s is not None) - tabs[0].opened if any(
            t.wait_s is not None for t in tabs) else time.perf_counter() - t0
        time.sleep(3.0)  # ui.loaders.collect_after_run's collection, a moment after the last run
        settled_mb = sampler.rss_mb()
        peak_mb = sampler.stop()
        for context in {id(tab.page.context): tab.page.context for tab in tabs if tab.page is not None}.values():
            if context is profile:  # the profile outlives the run: its pages go
                for tab_page in context.pages:
                    tab_page.close()
            else:
                context.close()
    finally:
        server.stop()
    waits = [t.wait_s for t in tabs if t.wait_s is not None]
    median = statistics.median(waits) if waits else float("nan")
    slowest = max(waits) if waits else float("nan")
    served = [t.served_s() for t in tabs if t.wait_s is not None and t.frames]
    return {"clients": "browser tabs" if browser is not None else "remote users (websocket protocol, no browser here)",
            "browser_profile": None if browser is None else "persistent (returning user)" if profile is not None else
            "fresh context, scripts cached" if shared is not None else "fresh context each",
            "max_runs": max_runs, "users": users, "tokens": n_tokens, "every_tab_drew": len(waits) == users,
            "drew": len(waits), "waits_s": [round(t.wait_s, 2) if t.wait_s is not None else None for t in tabs],
            "errors": [t.error for t in tabs if t.wait_s is None],
            "median_s": round(median, 2), "slowest_s": round(slowest, 2),
            "median_over_slowest": round(median / slowest, 3) if waits else None,
            "served_s": [None if t.served_s() is None or not t.frames else round(t.served_s(), 2) for t in tabs],
            "served_median_over_slowest": round(statistics.median(served) / max(served), 3) if served else None,
            "idle_rss_mb": round(idle_mb), "peak_rss_mb": round(peak_mb), "all_drawn_after_s": round(total_s, 2),
            "rss_mb_as_tabs_drew": sorted((round(t.wait_s, 1), round(t.rss_mb)) for t in tabs if t.wait_s is not None),
            "rss_mb_3s_after_all_drew_tabs_open": round(settled_mb),
            "rss_timeline": [(round(t - t0, 2), round(mb)) for t, mb in sampler.samples]}


def report(row: dict) -> str:
    ok_ratio = row["median_over_slowest"] is not None and row["median_over_slowest"] <= TARGET_RATIO
    profile = f" ({row['browser_profile']})" if row["browser_profile"] else ""
    return (f"AE_MAX_RUNS={row['max_runs']}: {row['users']} {row['clients']}{profile} × {row['tokens']} tokens "
            f"(SmolLM2)\n"
            f"  every {'tab drew' if row['clients'] == 'browser tabs' else 'user was served its page'}: "
            f"{'yes' if row['every_tab_drew'] else 'NO'} ({row['drew']}/{row['users']})"
            f"{'  ' + '; '.join(row['errors']) if row['errors'] else ''}\n"
            f"  waits (tab order): {', '.join('-' if w is None else f'{w:.1f}' for w in row['waits_s'])} s\n"
            f"  median wait {row['median_s']:.1f} s, slowest {row['slowest_s']:.1f} s, median/slowest "
            f"{row['median_over_slowest']} (target <= {TARGET_RATIO}: {'met' if ok_ratio else 'not met'})\n"
            + (f"  served (the server's last message of the run reached the tab; the rest is drawing in this machine's "
               f"browser): {', '.join('-' if w is None else f'{w:.1f}' for w in row['served_s'])} s, median/slowest "
               f"{row['served_median_over_slowest']}\n" if row['served_median_over_slowest'] is not None else "")
            + f"  RSS idle {row['idle_rss_mb']} MB, peak {row['peak_rss_mb']} MB (target <= {TARGET_PEAK_MB} MB: "
            f"{'met' if row['peak_rss_mb'] <= TARGET_PEAK_MB else 'not met'}), "
            f"{row['rss_mb_3s_after_all_drew_tabs_open']} MB once all drew (tabs still open)\n"
            f"  RSS as each tab drew (s, MB): "
            f"{', '.join(f'{w:.0f} s {m}' for w, m in row['rss_mb_as_tabs_drew'])}")


def _nice_browser(nice: int) -> int:
    """Set the niceness of this process's Chromium (its browser process: renderers it starts later inherit it)."""
    niced = 0
    for child in psutil.Process().children(recursive=True):
        try:
            if "chrom" in child.name() or "headless" in child.name():
                child.nice(nice)
                niced += 1
        except psutil.Error:
            continue
    return niced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=8, help="tabs opened at once (default 8)")
    parser.add_argument("--tokens", type=int, default=400, help="tokens of each tab's text (default 400)")
    parser.add_argument("--max-runs", type=int, nargs="+", default=[1],
                        help="AE_MAX_RUNS of the server; several values run one after another, each on a fresh server")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--served", action="store_true",
                        help="also time when the server's last message of each tab's run reached it (costs this "
                             "process CPU: every message passes through it)")
    parser.add_argument("--fresh-contexts", action="store_true",
                        help="give each tab an empty browser context (no cached JavaScript) instead of one shared, "
                             "warmed context")
    parser.add_argument("--remote", action="store_true",
                        help="users whose browsers are elsewhere: each speaks Streamlit's websocket protocol from this "
                             "process (harness/protocol.py), so no browser shares the server's cores; a user's "
                             "wait ends when its page's run has finished with the page's figures")
    parser.add_argument("--profile", action="store_true",
                        help="the tabs share one persistent Chromium profile (a folder), as a returning user's "
                             "browser: its disk cache keeps V8's compiled code, which a fresh context recompiles")
    parser.add_argument("--browser-nice", type=int, default=0,
                        help="run Chromium at this niceness (19: the server's passes go first, as when the users' "
                             "browsers run on their own machines; default 0: browser and server share the cores)")
    args = parser.parse_args()
    log_dir = Path(tempfile.mkdtemp(prefix="bench_users_"))
    print(f"server logs in {log_dir}; load average {psutil.getloadavg()[0]:.1f} on {psutil.cpu_count()} cores",
          flush=True)
    rows = []
    if args.remote:
        launcher = contextlib.nullcontext()
    elif args.profile:
        launcher = open_chromium_profile(tempfile.mkdtemp(prefix="bench_users_profile_"),
                                         viewport={"width": 1400, "height": 1000})
    else:
        launcher = open_chromium()
    with launcher as browser:
        profile = browser if args.profile else None
        if args.browser_nice and browser is not None:
            niced = _nice_browser(args.browser_nice)
            print(f"Chromium ({niced} processes) runs at niceness {args.browser_nice}", flush=True)
        for k, max_runs in enumerate(args.max_runs):
            row = run_once(browser, args.users, args.tokens, max_runs, first_variant=k * args.users, log_dir=log_dir,
                           fresh_contexts=args.fresh_contexts, served=args.served, profile=profile)
            rows.append(row)
            print(report(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
