"""The one launcher of the app server and Chromium, for the browser tests, the benches and the image test:
the app started as `make run` starts it, and Debian's Chromium under Playwright."""

from __future__ import annotations

import ast
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags Chromium keeps trying Google's hosts on a closed network.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
CHROMIUM_MISSING = "Chromium not installed: apt-get install chromium"
START_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def app_pages() -> list[tuple[str, str]]:
    """(file, title) of every page in app.py's PAGES, read without running app.py (a missing file fails there)."""
    tree = ast.parse((ROOT / "app.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PAGES" for t in node.targets):
            return [(path, title) for path, title, *_ in ast.literal_eval(node.value)]
    raise AssertionError("app.py has no PAGES list")


def nav_to(page, title: str, timeout_ms: int = 120_000) -> None:
    """Open the page ``title`` from the app's navigation in the header (its section's menu, then the link)."""
    tree = ast.parse((ROOT / "app.py").read_text())
    pages = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "PAGES" for t in node.targets))
    section = next(section for _, name, _, section, *_ in pages if name == title)
    page.locator('[data-testid="stTopNavSection"]').filter(has_text=section).first.click(timeout=timeout_ms)
    page.locator('[data-testid="stTopNavDropdownLink"]').filter(has_text=title).first.click(timeout=timeout_ms)


def streamlit_command(port: int) -> list[str]:
    """`make run`'s command (the venv's streamlit on app.py), on ``port``, headless, without a file watcher.

    No watcher, as in the image: a test or bench server must not reload when a file of the checkout changes,
    and the watcher's re-walks of the tree (``.venv``, ``node_modules``) took most of the server's CPU during a
    query-key head change.
    """
    exe = ROOT / ".venv" / "bin" / "streamlit"
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "streamlit"]
    return base + ["run", "app.py", "--server.port", str(port), "--server.headless", "true",
                   "--server.fileWatcherType", "none"]


class AppServer:
    """One streamlit process of the real app, offline, on a free port; ``rss_mb`` reads its memory.

    ``log_path`` keeps its output (None discards it); ``start_profile`` samples it with py-spy.
    """

    def __init__(self, log_path: Path | None = None, extra_env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.profiler: subprocess.Popen | None = None
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(extra_env or {})}
        with open(log_path or os.devnull, "w") as log:
            # Its own process group, so that stop() also ends anything the server started.
            self.proc = subprocess.Popen(streamlit_command(self.port), cwd=ROOT, env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_healthy()

    @property
    def origin(self) -> str:
        return self.url

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"streamlit exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"/_stcore/health did not answer in {START_TIMEOUT_S} s:\n{self.log_tail()}")
            time.sleep(0.5)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path else "(no log kept)"

    def rss_mb(self) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            kb = int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))
        return kb / 1024

    def start_profile(self, path: Path) -> None:
        """Sample the server with py-spy (raw collapsed stacks) into ``path`` until ``stop_profile``."""
        self.profiler = subprocess.Popen(
            [str(ROOT / ".venv/bin/py-spy"), "record", "-p", str(self.proc.pid), "-r", "50", "--format", "raw",
             "-o", str(path), "--nonblocking", "--threads"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop_profile(self) -> None:
        if self.profiler is not None:
            self.profiler.send_signal(signal.SIGINT)
            self.profiler.wait(60)
            self.profiler = None

    def stop(self) -> None:
        self.stop_profile()
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@contextlib.contextmanager
def open_chromium():
    """Playwright's Chromium (Debian's build), closed on exit: ``with open_chromium() as browser``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        new_context, new_page = browser.new_context, browser.new_page

        def patient_context(*args, **kwargs):
            context = new_context(*args, **kwargs)
            context.set_default_timeout(ELEMENT_TIMEOUT_S * 1000)
            return context

        def patient_page(*args, **kwargs):
            page = new_page(*args, **kwargs)
            page.set_default_timeout(ELEMENT_TIMEOUT_S * 1000)
            return page

        browser.new_context, browser.new_page = patient_context, patient_page  # every test's waits: one limit
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def new_page(browser, width: int = 1400, height: int = 1600):
    """A page in a fresh context of ``browser`` and the list its page errors go to, closed on exit:
    ``with new_page(browser) as (page, errors)``."""
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        yield page, errors
    finally:
        context.close()


@contextlib.contextmanager
def open_chromium_profile(user_data_dir: str | Path, **context_options):
    """A Chromium context on a profile folder, as a returning user's browser has (``with ... as context``): its disk
    cache keeps V8's compiled code, so a tab of the app boots in about half the CPU of a fresh context's (1.2 s
    against 2.3 s to its websocket, measured on a 2-core machine). Closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(str(user_data_dir), executable_path=str(CHROMIUM),
                                                       args=CHROMIUM_ARGS, **context_options)
        context.set_default_timeout(ELEMENT_TIMEOUT_S * 1000)
        try:
            yield context
        finally:
            context.close()


def chromium():
    """A generator fixture body: ``open_chromium()``'s browser, closed afterwards."""
    with open_chromium() as browser:
        yield browser


RUN_TIMEOUT_S = 300
"""One generous limit for a run to finish: a slow or busy machine's first SmolLM2 pass included."""
ELEMENT_TIMEOUT_S = 120
"""How long a browser test's click, read or wait gives the app to draw the element it needs (every context and page
``open_chromium`` makes): Playwright's own 30 s ran out for four tests when the whole suite ran on one core."""
# The app is idle: Streamlit's frontend says its script is not running (it says "initial" before the first run, so a
# freshly opened page is not idle), the websocket is up, and no spinner is drawn (a fragment's, a cached call's).
IDLE_JS = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  return !!app && app.getAttribute('data-test-script-state') === 'notRunning'
    && app.getAttribute('data-test-connection-state') === 'CONNECTED'
    && !document.querySelector('[data-testid="stSpinner"]');
}"""


def wait_for_run(page, timeout_s: float = RUN_TIMEOUT_S, quiet_s: float | None = None, *,
                 selector: str | None = None, text: str | None = None) -> None:
    """Until the app's own state says its run has finished, and the element the caller needs is there.

    Finished: ``stApp``'s ``data-test-script-state`` is ``notRunning`` (Streamlit's frontend sets it from the
    server's script-started and script-finished messages), the websocket is connected, and no spinner shows. Then,
    when given, ``selector`` (a CSS selector) or ``text`` (a text in the page) must be attached, and the app idle
    again (the element may come from a rerun the first one started). One limit, ``timeout_s``, for all of it.

    Right after a click the app may not have started the run the click asks for (the message is on its way), so a
    caller that waits for a click's result names what the result draws (``selector`` or ``text``), or counts the
    runs with ``ScriptRuns``. ``quiet_s`` is ignored: the wait no longer asks for a quiet spell (kept so that older
    callers still call it).
    """
    del quiet_s
    deadline = time.monotonic() + timeout_s
    ms = lambda: max(1.0, (deadline - time.monotonic()) * 1000)  # noqa: E731 - what is left of the one limit
    try:
        page.wait_for_function(IDLE_JS, timeout=ms(), polling=100)
        if selector is None and text is None:
            return
        target = page.locator(selector) if selector is not None else page.get_by_text(text, exact=False)
        if selector is not None and text is not None:
            target = target.filter(has_text=text)
        target.first.wait_for(state="attached", timeout=ms())
        page.wait_for_function(IDLE_JS, timeout=ms(), polling=100)
    except Exception as exc:  # noqa: BLE001 - Playwright's TimeoutError: say what was awaited
        if "Timeout" not in type(exc).__name__ and "Timeout" not in str(exc):
            raise
        state = page.evaluate("""() => { const a = document.querySelector('[data-testid="stApp"]');
            return a ? [a.getAttribute('data-test-script-state'), a.getAttribute('data-test-connection-state')]
                     : null; }""")
        wanted = f" and {selector or ''}{' ' if selector and text else ''}{repr(text) if text else ''}" \
            if selector or text else ""
        raise AssertionError(f"the app did not finish its run{wanted} in {timeout_s:.0f} s "
                             f"(script state, connection: {state})") from exc


class ScriptRuns:
    """Counts the runs the server starts and finishes for one page, from its websocket messages (``new_session``
    opens every run, a fragment's too; ``script_finished`` ends it). Make it before the page opens the app.

    ``started`` and ``finished`` are read while Playwright runs (any call on the page lets its events through). A new
    websocket (the page opened again, a reconnection) is a new session: what the old one left running is not waited
    for.
    """

    def __init__(self, page) -> None:
        self.started = 0
        self.finished = 0
        self._socket = None
        page.on("websocket", self._on_socket)

    def _on_socket(self, ws) -> None:
        self._socket = ws
        self.finished = self.started
        ws.on("framereceived", lambda payload: self._on_frame(ws, payload))

    def _on_frame(self, ws, payload) -> None:
        if ws is not self._socket or not isinstance(payload, (bytes, bytearray)):
            return
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        msg = ForwardMsg()
        try:
            msg.ParseFromString(bytes(payload))
        except Exception:  # noqa: BLE001 - not a ForwardMsg (no other frames are expected)
            return
        kind = msg.WhichOneof("type")
        if kind == "new_session":
            # A new run ends the one before it: Streamlit may drop a stopped run's own ``script_finished``
            # (FINISHED_EARLY_FOR_RERUN) when the rerun's messages replace it in the queue (seen after a Stop on the
            # Head atlas page); the page's script state (``IDLE_JS``) still says when the new run ends.
            self.finished = self.started
            self.started += 1
        elif kind == "script_finished":
            self.finished += 1

    @property
    def idle(self) -> bool:
        return self.finished >= self.started


# Every element an injected `<img onerror>`, `<script>` or link could create; none may exist in the page or an iframe.
INJECTED = 'img[src="x"], img[onerror], [onerror*="alert"], a[href*="evil.example"], a[href^="javascript:"]'
INJECTED_SCRIPT_JS = """() => [...document.querySelectorAll('script')].filter(s => s.textContent.includes('alert(1)')).length"""


def injected_elements(page) -> list[str]:
    """Injected elements and scripts in the page and in every iframe (bertviz views live in iframes)."""
    found = []
    for frame in page.frames:
        try:
            n = frame.locator(INJECTED).count()
            scripts = frame.evaluate(INJECTED_SCRIPT_JS)
        except Exception:  # noqa: BLE001 - a frame that navigated away mid-check has nothing left in it
            continue
        if n or scripts:
            found.append(f"{frame.url}: {n} injected elements, {scripts} injected scripts")
    return found
