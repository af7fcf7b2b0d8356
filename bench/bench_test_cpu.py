"""Where a test's CPU goes: run pytest on the given tests and print the CPU seconds of every process it started, by
kind (the app servers, Chromium's renderer, GPU and other processes, Playwright's driver, CLI runs, pytest itself),
beside the wall time.

CI's two cores are full through its parallel phase (5% idle, 29 Nov), so a test's cost to CI is its CPU, not its
wall time: a test that sleeps costs nothing while the other worker runs. Every process is read with psutil each half
second, so one that lives less than that is missed; a reaped child's CPU is not counted twice (each process's own
user + system time, not its children's).

Usage: .venv/bin/python bench/bench_test_cpu.py tests/test_press_everything_encoder_browser.py [pytest args ...]
Pin it to one core (``taskset -c 1``) to read the figures as the CPU one worker needs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil  # comes with accelerate and ipython; bench/bench_users.py reads the server's RSS with it too

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_S = 0.5


def kind_of(cmdline: str, root: bool) -> str:
    """What a process is, from its command line."""
    if root:
        return "pytest (the test process)"
    if "streamlit" in cmdline and " run " in cmdline:
        return "app server (streamlit run)"
    if "chrom" in cmdline:
        for flag, name in (("--type=renderer", "renderer"), ("--type=gpu", "GPU process")):
            if flag in cmdline:
                return f"Chromium {name}"
        return "Chromium, other"
    if "playwright" in cmdline or cmdline.startswith("node"):
        return "Playwright driver"
    if "model_core" in cmdline:
        return "CLI runs (python -m model_core)"
    if "ray" in cmdline:
        return "Ray processes"
    return "other: " + cmdline[:50]


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *argv], cwd=ROOT,
                            env=env)
    root = psutil.Process(proc.pid)
    seen: dict[int, tuple[float, str]] = {}  # pid -> (most CPU seconds seen, kind)
    while proc.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:  # pytest just ended
            break
        for p in tree:
            try:
                times = p.cpu_times()  # the process's own, not its reaped children's
                kind = seen[p.pid][1] if p.pid in seen else kind_of(" ".join(p.cmdline()), p.pid == proc.pid)
            except psutil.Error:  # a process that just ended
                continue
            seen[p.pid] = (max(times.user + times.system, seen.get(p.pid, (0.0, ""))[0]), kind)
        time.sleep(SAMPLE_S)
    proc.wait()
    wall = time.monotonic() - start
    by_kind: Counter[str] = Counter()
    for seconds, kind in seen.values():
        by_kind[kind] += seconds
    print(f"\n{wall:8.1f} s  wall (pytest exit status {proc.returncode})")
    print(f"{sum(by_kind.values()):8.1f} s  CPU, all processes")
    for kind, seconds in by_kind.most_common():
        print(f"{seconds:8.1f} s  {kind}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
