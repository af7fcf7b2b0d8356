"""120 reruns with 120 different texts: the app's memory plateaus once its bounded caches are full.

The reruns run in a fresh Python process (AppTest drives the real app.py, bundled BERT, 20 sessions
of 10 reruns each), so its resident memory (VmRSS) is the app's alone. Each text has about 120
tokens, so one trace is about 8 MB: the 70 traces between the two windows compared would add over 500 MB, far
above the bound. (The cache is full by run 20: 590 MB at run 10, 609 at run 20, 622 at run 120.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
RUNS = 120
EARLY, LATE = (20, 50), (90, 120)  # the windows of runs compared, 70 traces apart
RUNS_PER_SESSION = 10
MAX_GROWTH_MB = 120  # by run 20 the trace cache (ui.loaders.TRACES: 12 entries at most, AE_TRACE_CACHE_MB) is full

DRIVER = textwrap.dedent('''
    import gc, json, os, random, sys, time
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import torch
    from streamlit.testing.v1 import AppTest

    # Memory, not speed, is measured: one intra-op thread keeps 120 forward passes quick on a
    # shared 2-core runner, where two spinning OpenMP threads made each pass ~10x slower.
    torch.set_num_threads(1)

    app, runs, per_session = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    words = ("time flies like an arrow fruit a banana river bank water house cat dog music light "
             "night day city road tree stone green blue red small large old new quick slow").split()
    rng = random.Random(0)

    def rss_mb():
        with open("/proc/self/status") as f:
            line = next(l for l in f if l.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024

    samples, t0, at, trace_mb = [], time.monotonic(), None, 0.0
    for i in range(runs):
        if i % per_session == 0:
            at = AppTest.from_file(app, default_timeout=180)  # a new user; the old session is dropped
        text = " ".join(rng.choice(words) for _ in range(110)) + f" run {i}"
        at.session_state["ctl_text_a"] = text
        at.session_state["ctl_text_b"] = ""
        if "_app_context" in at.session_state:  # each run goes through app.py (see tests/test_pages.py)
            del at.session_state["_app_context"]
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        trace = at.session_state["_app_context"].trace
        if os.environ.get("AE_TEST_LEAK_TRACES"):  # negative control: keep every trace, as a leak would
            globals().setdefault("leak", []).append(trace)
        assert trace is not None and trace.tokens[-3:] == ("run", str(i), "[SEP]"), trace and trace.tokens[-3:]
        trace_mb = sum(v.nbytes for v in vars(trace).values() if hasattr(v, "nbytes")) / 2**20
        if i % 10 == 9 or i == 0:
            gc.collect()
            samples.append((i + 1, round(rss_mb(), 1)))
    print(json.dumps({"samples": samples, "trace_mb": round(trace_mb, 2), "seconds": round(time.monotonic() - t0, 1)}))
''')


def test_memory_plateaus_over_120_reruns_with_different_texts(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    out = subprocess.run([sys.executable, str(driver), str(ROOT / "app.py"), str(RUNS), str(RUNS_PER_SESSION)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    samples = dict(result["samples"])
    print(f"\nRSS (MB) after n reruns: {result['samples']}\none trace: {result['trace_mb']} MB; "
          f"{RUNS} reruns in {result['seconds']} s")
    # RSS swings as the bounded cache fills and evicts, so compare window means.
    early = [mb for n, mb in samples.items() if EARLY[0] <= n <= EARLY[1]]
    late = [mb for n, mb in samples.items() if LATE[0] <= n <= LATE[1]]
    growth = sum(late) / len(late) - sum(early) / len(early)
    unbounded_mb = (LATE[1] - EARLY[1]) * result["trace_mb"]
    # The bound must be far below what keeping every trace would cost, or the test could not fail.
    assert unbounded_mb > 4 * MAX_GROWTH_MB, (unbounded_mb, result)
    print(f"mean RSS, runs {EARLY} -> {LATE}: {growth:+.0f} MB (keeping every trace: +{unbounded_mb:.0f} MB)")
    assert growth < MAX_GROWTH_MB, (
        f"RSS grew {growth:.0f} MB from runs {EARLY} to runs {LATE} (keeping every trace: "
        f"~{unbounded_mb:.0f} MB): {result['samples']}")


# -- idle sessions hold no trace: the cache's byte budget bounds them all (ui.run_traces) --------------------------

APP = str(ROOT / "app.py")
SMALL = {"ctl_model": "custom", "ctl_num_hidden_layers": 2, "ctl_num_attention_heads": 2, "ctl_hidden_size": 32}


def _heatmaps_session(text: str):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=180)
    for key, value in {**SMALL, "ctl_text_a": text, "ctl_text_b": ""}.items():
        at.session_state[key] = value
    at.run()
    at.switch_page("pages/heatmaps.py")
    del at.session_state["_app_context"]  # through app.py, not the page alone (tests/test_pages.py)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.get("plotly_chart")) >= 3  # overview, focused head, the per-head summary
    return at


def test_an_idle_session_holds_no_trace_once_the_cache_let_it_go(monkeypatch):
    """A session's context, its page's globals, fragments, callbacks and downloads outlive its run: none may keep
    its trace, or every idle tab holds one beside the cache's budget (eight 400-token SmolLM2 tabs held 2.3 GB).
    With room for one trace, a second session's text pushes the first's out, and it is freed at once (no garbage
    collection runs); the first session's context still names it, and reading it builds it again."""
    import gc
    import weakref

    import ui.loaders

    monkeypatch.setenv("AE_TRACE_CACHE_MB", "0.001")  # room for the latest trace only
    ui.loaders.TRACES.clear()
    gc.collect()
    gc.disable()
    try:
        first = _heatmaps_session("the cat sat on the mat")
        old = weakref.ref(first.session_state["_app_context"].trace)
        assert old() is not None
        _heatmaps_session("a dog ran in the park")
        assert len(ui.loaders.TRACES) == 1
        assert old() is None, [type(r).__name__ for r in gc.get_referrers(old())]
    finally:
        gc.enable()
    again = first.session_state["_app_context"].trace
    assert again.tokens[1:4] == ("the", "cat", "sat")


@pytest.mark.browser
def test_an_idle_tab_whose_trace_the_cache_let_go_redraws_on_a_head_change(tmp_path):
    """The focused head's fragment of an idle tab reads its trace from the cache; when another tab's text pushed it
    out, a head change still draws the new head (the whole page reruns and builds it again), with no traceback."""
    from harness.browser import CHROMIUM, CHROMIUM_MISSING, AppServer, open_chromium, wait_for_run

    if not CHROMIUM.exists():
        pytest.skip(CHROMIUM_MISSING)
    server = AppServer(tmp_path / "server.log", extra_env={"AE_TRACE_CACHE_MB": "0.001"})
    try:
        with open_chromium() as browser:
            tabs = []
            for text in ("the cat sat on the mat", "a dog ran in the park"):
                page = browser.new_context(viewport={"width": 1400, "height": 1400}).new_page()
                page.goto(f"{server.url}/heatmaps?text_a={text.replace(' ', '+')}", wait_until="domcontentloaded")
                page.get_by_role("heading", name="Layer 0, head 0").wait_for(timeout=180_000)
                wait_for_run(page, 180)
                tabs.append(page)
            first = tabs[0]
            combo = first.locator('section[data-testid="stSidebar"] input[role="combobox"][aria-label="Head"]')
            combo.click()
            combo.press("ArrowDown")
            first.locator('[role="listbox"] [role="option"][data-key="3"]').click()
            first.get_by_role("heading", name="Layer 0, head 3").wait_for(timeout=180_000)
            wait_for_run(first, 180)
            assert first.locator('[data-testid="stException"]').count() == 0
            sentence = first.locator('section[data-testid="stSidebar"] textarea[aria-label="Sentence A"]')
            assert sentence.input_value() == "the cat sat on the mat"
    finally:
        server.stop()


def test_a_fragment_rerun_gets_the_page_trace_from_the_cache_and_lets_it_go_after():
    """``page_traces`` around a fragment's rerun: the trace ``release_run`` took out of the page's globals is back
    (the cache's object) while the fragment runs, and out again afterwards."""
    from model_core import TraceRequest
    from ui.loaders import TRACES
    from ui.run_traces import RELEASED, page_traces

    class Trace:  # stands for a cached trace; only its identity matters here
        nbytes = 1

    key = ("full", TraceRequest(text_a="page traces test"))
    cached = TRACES.get(key, Trace)
    page = {"__name__": "__main__", "__file__": "pages/x.py", RELEASED: {"t": key}, "title": "kept"}
    with page_traces(page):
        assert page["t"] is cached
    assert "t" not in page and page["title"] == "kept" and page[RELEASED] == {"t": key}
