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
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def open_chromium_profile(user_data_dir: str | Path, **context_options):
    """A Chromium context on a profile folder, as a returning user's browser has (``with ... as context``): its disk
    cache keeps V8's compiled code, so a tab of the app boots in about half the CPU of a fresh context's (1.2 s
    against 2.3 s to its websocket, measured on a 2-core machine). Closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(str(user_data_dir), executable_path=str(CHROMIUM),
                                                       args=CHROMIUM_ARGS, **context_options)
        try:
            yield context
        finally:
            context.close()


def chromium():
    """A generator fixture body: ``open_chromium()``'s browser, closed afterwards."""
    with open_chromium() as browser:
        yield browser


def wait_for_run(page, timeout_s: float, quiet_s: float = 1.5) -> None:
    """Until the app has drawn and the status widget ("Running…") and spinners stayed away ``quiet_s``."""
    page.wait_for_selector('[data-testid="stSidebar"]', timeout=timeout_s * 1000)
    deadline = time.monotonic() + timeout_s
    quiet_since = None
    while time.monotonic() < deadline:
        busy = page.locator('[data-testid="stStatusWidget"], [data-testid="stSpinner"]').count() > 0
        if busy:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return
        page.wait_for_timeout(200)
    raise AssertionError(f"the page was still running after {timeout_s} s")
