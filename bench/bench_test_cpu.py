"""Where a test's CPU goes: run pytest on the given tests and print the CPU seconds of every process it started, by
kind (the app servers, Chromium's renderer, GPU and other processes, Playwright's driver, CLI runs, pytest itself),
beside the wall time.

CI's two cores are full through its parallel phase (5% idle, 29 Nov), so a test's cost to CI is its CPU, not its
wall time: a test that sleeps costs nothing while the other worker runs. Samples ``/proc`` every half second, so a
process that lives less than that is missed; a reaped child's CPU is not counted twice (each process's own
``utime + stime``, not its children's).

Usage: .venv/bin/python bench/bench_test_cpu.py tests/test_press_everything_encoder_browser.py [pytest args ...]
Pin it to one core (``taskset -c 1``) to read the figures as the CPU one worker needs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HZ = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.5


def _children() -> dict[int, list[int]]:
    """Every process's children (parent pid -> pids), from /proc."""
    out: dict[int, list[int]] = defaultdict(list)
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            out[int(stat.rsplit(")", 1)[1].split()[1])].append(int(name))
    return out


def _own_ticks(pid: int) -> int | None:
    """utime + stime of ``pid`` itself (its reaped children not included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


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
    seen: dict[int, tuple[int, str]] = {}  # pid -> (most ticks seen, kind)
    while proc.poll() is None:
        tree, stack = _children(), [proc.pid]
        while stack:
            pid = stack.pop()
            stack += tree.get(pid, [])
            ticks = _own_ticks(pid)
            if ticks is None:
                continue
            if pid not in seen:
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                seen[pid] = (ticks, kind_of(cmdline.strip(), pid == proc.pid))
            seen[pid] = (max(ticks, seen[pid][0]), seen[pid][1])
        time.sleep(SAMPLE_S)
    wall = time.monotonic() - start
    by_kind: Counter[str] = Counter()
    for ticks, kind in seen.values():
        by_kind[kind] += ticks / HZ
    print(f"\n{wall:8.1f} s  wall (pytest exit status {proc.returncode})")
    print(f"{sum(by_kind.values()):8.1f} s  CPU, all processes")
    for kind, seconds in by_kind.most_common():
        print(f"{seconds:8.1f} s  {kind}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
