"""200 reruns with 200 different texts: the app's memory plateaus once its bounded caches are full.

The reruns run in a fresh Python process (AppTest drives the real app.py, bundled BERT, 20 sessions
of 10 reruns each), so its resident memory (VmRSS) is the app's alone. Each text has about 120
tokens, so one trace is several MB: 200 kept traces would add over a GB, far above the bound.
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
RUNS = 200
RUNS_PER_SESSION = 10
MAX_GROWTH_MB = 150  # by run 50 the trace cache (ui.loaders.TRACES: 12 entries at most, AE_TRACE_CACHE_MB) is full

DRIVER = textwrap.dedent('''
    import gc, json, os, random, sys, time
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import torch
    from streamlit.testing.v1 import AppTest

    # Memory, not speed, is measured: one intra-op thread keeps 200 forward passes quick on a
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


def test_memory_plateaus_over_200_reruns_with_different_texts(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    out = subprocess.run([sys.executable, str(driver), str(ROOT / "app.py"), str(RUNS), str(RUNS_PER_SESSION)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    samples = dict(result["samples"])
    print(f"\nRSS (MB) after n reruns: {result['samples']}\none trace: {result['trace_mb']} MB; "
          f"{RUNS} reruns in {result['seconds']} s")
    # RSS swings by ~100 MB as the bounded cache fills and evicts, so compare window means:
    # runs 50-100 against runs 150-200, 100 traces apart.
    early = [mb for n, mb in samples.items() if 50 <= n <= 100]
    late = [mb for n, mb in samples.items() if 150 <= n <= RUNS]
    growth = sum(late) / len(late) - sum(early) / len(early)
    unbounded_mb = 100 * result["trace_mb"]
    # The bound must be far below what keeping every trace would cost, or the test could not fail.
    assert unbounded_mb > 4 * MAX_GROWTH_MB, (unbounded_mb, result)
    print(f"mean RSS, runs 50-100 -> 150-200: {growth:+.0f} MB (keeping every trace: +{unbounded_mb:.0f} MB)")
    assert growth < MAX_GROWTH_MB, (
        f"RSS grew {growth:.0f} MB from runs 50-100 to runs 150-200 (keeping every trace: "
        f"~{unbounded_mb:.0f} MB): {result['samples']}")
