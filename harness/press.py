"""Press everything a user can press, page by page, in the real app: the engine of the press-everything browser tests.

Every page of app.py's PAGES is opened from its link in the navigation, then every button, toggle, checkbox, radio
option and tab in the main area is pressed once, in page order, and the app is let finish the run each press starts
(counted from the server's own messages, ``harness.browser.ScriptRuns``). Stop buttons and downloads are left alone;
a run still going after ``LONG_RUN_S`` is stopped with the page's own Stop button, as a user would. After each press
an exception or traceback drawn by Streamlit, an error box, a page error in the browser or a traceback in the
server's log is a failure that names the page and the press. All failures are collected and reported together.

The elements are found again after every press (a rerun redraws the page) and known by their labels, so a press
that adds a button (a result's "Open in heatmaps") adds it to what is pressed, and a report reads as the page does.
"""

from __future__ import annotations

import os
import re
import time
from urllib.parse import parse_qs, urlsplit
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.browser import IDLE_JS, RUN_TIMEOUT_S, ScriptRuns, app_pages, nav_to, wait_for_run

MAX_PRESSES_PER_PAGE = 40
"""A bound on one page's presses, should a page keep adding new buttons."""
START_S = 20.0
"""How long a press that reruns the app may take to start its run (a busy server answers late)."""
NO_RERUN_START_S = 1.0
"""How long to watch for a run after a press that normally starts none (a tab, a widget inside a form)."""
LONG_RUN_S = 5.0
"""A run still going after this long is stopped with the page's Stop button, or Streamlit's own where it has none.
What a long run's press checks is that it starts, shows its progress and stops cleanly, and all of that is seen by
5 s: at 15 s, five presses a model (the atlas, its Continue, retrieval heads, the needle test, a projection) each ran
their full 15 s for nothing more, and at 8 s seven presses a model still ran 8 s each (28 Nov)."""
PRESS_ENV = {"AE_MAX_PAIRS": "4", "AE_CORPUS_MAX_TEXTS": "24"}
"""The settings of the server the press-everything tests drive: a small server's caps (a dataset's pairs, a corpus
run's texts), so that a press that starts a long run starts a short one, as the issue allows ("a small generator
count"); every page, widget and message is the same as under the defaults."""
POLL_MS = 50
ANSI = re.compile(r"\x1b\[[0-9;]*m")
MODEL_PARAMS = ("model", "model_id", "weights", "causal", "norm_placement", "num_hidden_layers",
                "num_attention_heads", "hidden_size")
"""The link's parameters that name the model (the app writes those not at their default)."""

OPEN_EXPANDERS_JS = """() => document.querySelectorAll(
  '[data-testid="stMain"] [data-testid="stExpander"] details:not([open]) > summary').forEach(s => s.click())"""
# Every pressable element in the main area, in page order, tagged with data-ae-press so that Python can click the
# one it picked; collapsed expanders are opened first (their content is hidden until then). A tab or a radio option
# already selected is not pressed (pressing it does nothing); it is once another is picked.
COLLECT_JS = r"""(areas) => {
  const roots = areas.map(a => [a, document.querySelector(`[data-testid="${a}"]`)]).filter(([, r]) => r);
  if (!roots.length) return [];
  document.querySelectorAll('[data-ae-press]').forEach(el => el.removeAttribute('data-ae-press'));
  const text = el => (el ? (el.innerText || el.getAttribute('aria-label') || '') : '').replace(/\s+/g, ' ').trim();
  const shown = el => !!(el.offsetWidth || el.offsetHeight || el.getClientRects().length);
  const found = [];
  const seen = {};
  const selector = ['[data-testid="stButton"] button', '[data-testid="stFormSubmitButton"] button',
                    '[data-testid="stButtonGroup"] button[data-variant]', '[data-testid="stCheckbox"] label',
                    '[data-testid="stRadio"] [role="radiogroup"] label',
                    '[data-testid="stTabs"] [role="tab"]'].join(', ');
  for (const [area, root] of roots) {
  root.querySelectorAll('[data-testid="stExpander"] details:not([open]) > summary').forEach(s => s.click());
  root.querySelectorAll(selector).forEach(el => {
    // a widget's help icon is a button too: it shows a tooltip, nothing to press
    if (!shown(el) || el.closest('[data-testid="stWidgetLabel"], [data-testid="stTooltipIcon"]')) return;
    let kind, label, selected = false, disabled = false;
    const form = !!el.closest('[data-testid="stForm"]');
    if (el.matches('[role="tab"]')) {
      kind = 'tab'; label = text(el); selected = el.getAttribute('aria-selected') === 'true';
    } else if (el.closest('[data-testid="stRadio"]')) {
      const group = el.closest('[data-testid="stRadio"]');
      const input = el.querySelector('input');
      kind = 'radio'; label = `${text(group.querySelector('[data-testid="stWidgetLabel"]'))} → ${text(el)}`;
      selected = !!(input && input.checked); disabled = !!(input && input.disabled);
    } else if (el.closest('[data-testid="stCheckbox"]')) {
      const input = el.querySelector('input') || el.closest('[data-testid="stCheckbox"]').querySelector('input');
      kind = input && input.getAttribute('role') === 'switch' ? 'toggle' : 'checkbox';
      label = text(el); disabled = !!(input && input.disabled);
    } else {
      kind = 'button'; label = text(el); disabled = el.disabled || el.getAttribute('aria-disabled') === 'true';
      if (el.closest('[data-testid="stButtonGroup"]')) {
        const group = el.closest('[data-testid="stButtonGroup"]').parentElement;
        kind = 'option';
        label = `${text(group && group.querySelector('[data-testid="stWidgetLabel"]'))} → ${label}`;
        selected = el.getAttribute('aria-checked') === 'true';
      }
    }
    const base = `${area === 'stSidebar' ? 'sidebar ' : ''}${kind} "${label}"`;
    seen[base] = (seen[base] || 0) + 1;
    const key = seen[base] > 1 ? `${base} #${seen[base]}` : base;
    el.setAttribute('data-ae-press', String(found.length));
    found.push({index: found.length, key, kind, label, selected, disabled, form});
  });
  }
  return found;
}"""
STATE_JS = """() => { const a = document.querySelector('[data-testid="stApp"]');
  return [a && a.getAttribute('data-test-script-state'), a && a.getAttribute('data-test-connection-state'),
          [...document.querySelectorAll('[data-testid="stSpinner"]')].map(e => e.innerText).join(' | ')]; }"""
STOPPED_IDLE_JS = """() => { const a = document.querySelector('[data-testid="stApp"]');
  return !!a && a.getAttribute('data-test-script-state') === 'notRunning'
    && a.getAttribute('data-test-connection-state') === 'CONNECTED'; }"""
# The page's own Stop button, else the one Streamlit shows in its status widget while a script runs.
STOP_JS = """() => [...document.querySelectorAll('[data-testid="stMain"] [data-testid="stButton"] button')]
  .find(b => /\\bStop\\b/.test((b.innerText || '').trim()) && !b.disabled)
  || [...document.querySelectorAll('[data-testid="stStatusWidget"] button')]
  .find(b => /^Stop/.test((b.innerText || '').trim()) && !b.disabled)"""
PROBLEMS_JS = r"""() => {
  const out = [];
  document.querySelectorAll('[data-testid="stException"]').forEach(e => out.push('exception: ' + e.innerText));
  document.querySelectorAll('[data-testid="stAlertContentError"]').forEach(e => {
    if (!e.closest('[data-testid="stException"]')) out.push('error box: ' + e.innerText); });
  const main = document.querySelector('[data-testid="stMain"]');
  if (main && !out.length && main.innerText.includes('Traceback (most recent call last)'))
    out.push('traceback text: ' + main.innerText.slice(main.innerText.indexOf('Traceback'), 2000));
  return out.map(s => s.replace(/\s+/g, ' ').trim().slice(0, 1200));
}"""


def skipped(item: dict) -> bool:
    """Not pressed: Stop (it is pressed only to end a long run) and the one already selected."""
    return re.search(r"\bStop\b", item["label"]) is not None or item["selected"]


@dataclass
class PressReport:
    """What a press-everything pass did: every press as ``page: press``, the failures, seconds per page."""

    presses: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        lines = [f"{len(self.presses)} presses on {len(self.seconds)} pages, {sum(self.seconds.values()):.0f} s"]
        lines += [f"  {title}: {s:.1f} s, {sum(p.startswith(title + ': ') for p in self.presses)} presses"
                  for title, s in self.seconds.items()]
        lines += [f"note: {n}" for n in self.notes]
        lines += [f"FAILED {f}" for f in self.failures]
        return "\n".join(lines)


class Presser:
    """Presses everything on every page of one browser page (one session) of the app served with log ``log_path``."""

    def __init__(self, page, runs: ScriptRuns, start_url: str, log_path=None, run_timeout_s: float = RUN_TIMEOUT_S,
                 progress=None, on_open: Callable[[object, str], list[str]] | None = None,
                 sidebar: bool = False) -> None:
        self.page = page
        # Where the presses are: the main area, and the sidebar too on every page (``sidebar``)
        self.areas = ["stMain", "stSidebar"] if sidebar else ["stMain"]
        # What a test checks of each page as it opens, before any press (``drew_or_said``): problems, or [].
        self.on_open = on_open
        self.start_url = start_url
        # The model the pass is about, as the app's link says it once the start link has opened (set by ``start``):
        # a press that switches the sidebar to another model ("Use SmolLM2") is undone before the next press, so
        # that every page is pressed with this one.
        self.model: dict[str, list[str]] | None = None
        self.progress = progress or (lambda line: None)
        self.runs = runs
        self.log_path = log_path
        self.timeout_s = run_timeout_s
        self.report = PressReport()
        self._page_errors: list[str] = []
        self._log_at = log_path.stat().st_size if log_path is not None and log_path.exists() else 0
        page.on("pageerror", lambda e: self._page_errors.append(str(e)))

    # --- waiting -------------------------------------------------------------------------------------------------

    def _idle_in_page(self, stopped: bool = False) -> bool:
        """The page says its script is done; after a Stop, a spinner left behind is not waited for: a run stopped
        inside ``st.spinner`` (a cached computation: composition scores, a projection) ends before the spinner's
        own clean-up is sent, and Streamlit shows the stopped run's elements, that spinner too, until the next run."""
        return bool(self.page.evaluate(STOPPED_IDLE_JS if stopped else IDLE_JS))

    def _still_idle(self, stopped: bool = False) -> bool:
        started = self.runs.started
        self.page.wait_for_timeout(POLL_MS)
        return self.runs.started == started and self.runs.idle and self._idle_in_page(stopped)

    def settle(self, before: int, expect_run: bool, where: str, may_stop: bool = True) -> None:
        """After a press: wait for the run it starts (if one starts), stop it if long (``may_stop``; never a page's
        opening run), and wait for the app idle."""
        start = time.monotonic()
        limit = START_S if expect_run else NO_RERUN_START_S
        while self.runs.started <= before and time.monotonic() - start < limit:
            self.page.wait_for_timeout(POLL_MS)
        if expect_run and self.runs.started <= before:
            self.report.notes.append(f"{where}: no run started in {START_S:.0f} s")
        stopped = False
        deadline = start + self.timeout_s
        # Idle twice, POLL_MS apart: a run that reruns itself (st.rerun, a page switch) ends before the next starts.
        while not (self.runs.idle and self._idle_in_page(stopped) and self._still_idle(stopped)):
            if time.monotonic() > deadline:
                state = self.page.evaluate(STATE_JS)
                self.report.failures.append(f"{where}: the app was still running after {self.timeout_s:.0f} s "
                                            f"(runs started {self.runs.started}, finished {self.runs.finished}; "
                                            f"page: {state})")
                return
            if may_stop and not stopped and time.monotonic() - start > LONG_RUN_S:
                stop = self.page.evaluate_handle(STOP_JS).as_element()
                if stop is not None:
                    try:
                        stop.click(timeout=5_000)
                    except Exception:  # noqa: BLE001 - redrawn meanwhile (the run may have ended): look again
                        continue
                    stopped = True
                    self.report.notes.append(f"{where}: stopped after {LONG_RUN_S:.0f} s with Stop")
            self.page.wait_for_timeout(POLL_MS)

    # --- checking ------------------------------------------------------------------------------------------------

    def _server_log_tracebacks(self) -> list[str]:
        if self.log_path is None or not self.log_path.exists():
            return []
        with open(self.log_path, errors="replace") as f:
            f.seek(self._log_at)
            new = ANSI.sub("", f.read())  # Streamlit prints tracebacks through rich, in colour
            self._log_at = f.tell()
        found = []
        for chunk in new.split("Traceback (most recent call last)")[1:]:
            lines = [line for line in chunk.splitlines() if line.strip()]
            found.append("server log traceback: " + (lines[-1].strip() if lines else "?"))
        return found

    def check(self, where: str) -> None:
        problems = list(self.page.evaluate(PROBLEMS_JS)) + self._server_log_tracebacks()
        problems += [f"page error: {e}" for e in self._page_errors]
        self._page_errors.clear()
        for problem in problems:
            self.report.failures.append(f"{where}: {problem}")
            self.progress(f"FAILED {where}: {problem[:300]}")

    # --- pressing ------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Open the start link (the app with the model in its query) and wait for its run."""
        before = self.runs.started
        self.page.goto(self.start_url, wait_until="domcontentloaded")
        self.settle(before, True, "start", may_stop=False)
        wait_for_run(self.page, self.timeout_s, selector='[data-testid="stTopNavSection"]')  # the app is drawn
        self.check("start")
        if self.model is None:
            self.model = self._model_in_link()

    def _model_in_link(self) -> dict[str, list[str]]:
        query = parse_qs(urlsplit(self.page.url).query)
        return {name: query[name] for name in MODEL_PARAMS if name in query}

    def model_changed(self) -> bool:
        return self._model_in_link() != self.model

    def open(self, title: str) -> None:
        """Open ``title`` from the navigation and wait for its run."""
        before = self.runs.started
        nav_to(self.page, title)
        self.settle(before, True, f"{title}: open", may_stop=False)
        self.check(f"{title}: open")

    def press_page(self, title: str) -> None:
        """Open ``title`` (with the test's ``on_open`` check) and press everything on it once, in order."""
        t0 = time.monotonic()
        self.open(title)
        if self.model_changed():
            # The last press of the page before switched the model and was stopped while the model loaded (its
            # run writes the link at its end, so the switch shows only now, in this page's link): back to this
            # pass's model before the page is checked (seen on one core, 29 Nov: "Use the chapter-3 encoder" on Home
            # took over 5 s, was stopped, and the heatmaps page then opened on the encoder).
            self._back_to_the_model(title, f"{title}: opened on another model (a stopped switch before)")
        for problem in self.on_open(self.page, title) if self.on_open is not None else []:
            self.report.failures.append(f"{title}: open: {problem}")
        self._press_all(title)
        self.report.seconds[title] = time.monotonic() - t0

    def _back_to_the_model(self, title: str, why: str) -> None:
        """Open the start link again (a new session on this pass's model), then ``title``; noted with ``why``."""
        self.report.notes.append(f"{why}; switched back")
        self.start()
        self.open(title)

    def _press_all(self, title: str) -> None:
        path = self.page.url.split("?")[0]
        pressed: set[str] = set()
        for _ in range(MAX_PRESSES_PER_PAGE):
            items = [i for i in self.page.evaluate(COLLECT_JS, self.areas) if i["key"] not in pressed and not skipped(i)
                     and not i["disabled"]]
            if not items:
                break
            item = items[0]
            pressed.add(item["key"])
            where = f"{title}: {item['key']}"
            before = self.runs.started
            try:
                self.page.locator(f'[data-ae-press="{item["index"]}"]').click(timeout=10_000)
            except Exception as exc:  # noqa: BLE001 - redrawn under the pointer: noted, not a fault of the app
                self.report.notes.append(f"{where}: could not press ({type(exc).__name__})")
                continue
            self.report.presses.append(where)
            expect_run = not (item["kind"] == "tab" or (item["form"] and item["kind"] != "button"))
            t = time.monotonic()
            self.settle(before, expect_run, where)
            self.check(where)
            self.progress(f"{time.monotonic() - t:5.1f} s  {where}")
            if self.model_changed():  # the press switched the model: back to the one this pass is about
                self._back_to_the_model(title, f"{where}: switched the model")
            elif self.page.url.split("?")[0] != path:  # the press opened another page: back, as a user would go
                self.report.notes.append(f"{where}: opened {self.page.url.split('?')[0].rsplit('/', 1)[-1]}")
                self.open(title)
        else:
            self.report.notes.append(f"{title}: stopped at {MAX_PRESSES_PER_PAGE} presses")


def press_everything(page, runs: ScriptRuns, start_url: str, log_path=None, titles: list[str] | None = None,
                     progress=None, on_open: Callable[[object, str], list[str]] | None = None,
                     sidebar: bool = False) -> PressReport:
    """Open ``start_url`` (the app with the model in its query), then press everything on every page of PAGES (or
    ``titles``), each opened from the navigation and checked by ``on_open``, the sidebar's too on every page if
    ``sidebar``; the report of it all."""
    presser = Presser(page, runs, start_url, log_path, progress=progress, on_open=on_open, sidebar=sidebar)
    presser.start()
    for title in titles or [title for _, title in app_pages()]:
        presser.press_page(title)
    return presser.report


def press_server(folder):
    """An app server with ``PRESS_ENV``, its log and corpus runs in ``folder`` (stop it when done)."""
    from harness.browser import AppServer

    return AppServer(folder / "server.log", extra_env={**PRESS_ENV, "AE_CORPUS_DIR": str(folder / "runs")})


FIGURES = ('[data-testid="stMain"] .main-svg, [data-testid="stMain"] iframe, '
           '[data-testid="stMain"] img, [data-testid="stMain"] canvas')
DRAW_S = 30
"""After a page's run, how long the browser may take to draw what it received (Plotly, a corpus page's grids)."""


def drew_or_said(page, title: str) -> list[str]:
    """An ``on_open`` check: the page drew a figure, or said in a note why it draws none."""
    shown = page.locator(f'{FIGURES}, [data-testid="stAlertContentInfo"]').first
    try:
        shown.wait_for(timeout=DRAW_S * 1000)
    except Exception:  # noqa: BLE001 - a Playwright timeout: reported below as what is missing
        return [f"drew no figure and said nothing in {DRAW_S} s"]
    return []


def press_in_a_new_tab(browser, server, start_url: str,
                       on_open: Callable[[object, str], list[str]] | None = None) -> PressReport:
    """``press_everything`` in a fresh 1400 x 1000 browser context on ``server``, each press's time printed; the
    sidebar's elements are pressed on every page too with ``AE_PRESS_SIDEBAR=1`` (the widest pass: about three times
    the presses and the time, so not CI's)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    runs = ScriptRuns(page)
    try:
        return press_everything(page, runs, start_url, server.log_path, progress=print, on_open=on_open,
                                sidebar=os.environ.get("AE_PRESS_SIDEBAR") == "1")
    finally:
        context.close()
