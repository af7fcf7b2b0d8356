"""`make test`: the whole suite, in two phases, then the slowest tests of both.

1. Every test not marked ``serial``, over ``--workers`` pytest-xdist processes (``--dist loadfile``: a module's tests
   and its module-scoped fixtures, such as an app server, stay in one worker).
2. The ``serial`` tests alone, in this process's pytest: the tests that time a queue or load the machine on purpose
   (the gate in a browser and over the websocket, ten concurrent browser sessions) and cannot share the cores.

Both phases always run; the exit status is the first failing phase's (pytest's 5, "no tests collected", counts as
passing, for a selection that has no serial test). Any other arguments go to both phases' pytest, and a ``-m``
expression is combined with each phase's own. ``--order reverse`` runs the tests in reverse order (tests/conftest.py),
to show that no test depends on another having run first. ``AE_TEST_REPORTS=DIR`` keeps both phases' JUnit XML
reports in DIR.

**Longest files first.** With ``--dist loadfile`` a worker takes a whole file at a time, in the order handed out;
pytest-xdist's own order (the files with the most tests first) left the one-test browser files of 200-250 s for
last, and one worker idle for minutes at the end. So the workers get the files in ``tests/durations.json``'s order,
longest first (tests/conftest.py; ``--no-loadscope-reorder`` keeps it). ``--save-durations`` rewrites that file from
this run's reports, each file's seconds (setup, call and teardown of its tests).

Usage: python scripts/run_tests.py [--workers N] [--slowest K] [--save-durations] [pytest arguments ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DURATIONS = ROOT / "tests" / "durations.json"
NO_TESTS = 5  # pytest's exit status when the selection holds no test


def split_marker(args: list[str]) -> tuple[str | None, list[str]]:
    """The ``-m`` expression in ``args`` (or None), and the other arguments."""
    marker, rest, i = None, [], 0
    while i < len(args):
        if args[i] == "-m" and i + 1 < len(args):
            marker, i = args[i + 1], i + 2
            continue
        if args[i].startswith("-m") and len(args[i]) > 2:
            marker = args[i][2:].removeprefix("=")
        else:
            rest.append(args[i])
        i += 1
    return marker, rest


def without_workers(args: list[str]) -> list[str]:
    """``args`` less pytest-xdist's options: the serial phase runs in one process whatever the caller asked."""
    rest, i = [], 0
    while i < len(args):
        if args[i] in ("-n", "--numprocesses", "--dist", "--maxprocesses") and i + 1 < len(args):
            i += 2
            continue
        if not args[i].startswith(("-n=", "--numprocesses=", "--dist=", "--maxprocesses=")) and \
                not (args[i].startswith("-n") and (args[i][2:].isdigit() or args[i][2:] in ("auto", "logical"))):
            rest.append(args[i])
        i += 1
    return rest


def worker_args(workers: str) -> list[str]:
    """pytest-xdist's options for the parallel phase: whole files to a worker, in the collected order (the longest
    files first, tests/conftest.py), not xdist's own (the files with the most tests first)."""
    return [] if workers in ("0", "1") else ["-n", workers, "--dist", "loadfile", "--no-loadscope-reorder"]


def phase_marker(own: str, user: str | None) -> str:
    return own if user is None else f"({user}) and ({own})"


def test_times(reports: list[Path]) -> Iterator[tuple[float, str, str]]:
    """Each test's (seconds, file, name) in pytest's JUnit XML reports: its setup, call and teardown."""
    for report in reports:
        if not report.exists() or report.stat().st_size == 0:
            continue
        try:
            root = ET.parse(report).getroot()
        except ET.ParseError:  # a phase that crashed while writing it
            print(f"(the report {report} cannot be read)")
            continue
        for case in root.iter("testcase"):
            yield float(case.get("time") or 0.0), case.get("classname", "").replace(".", "/") + ".py", case.get("name")


def slowest(reports: list[Path], k: int) -> list[tuple[float, str]]:
    """The ``k`` longest tests (setup, call and teardown) in pytest's JUnit XML reports."""
    return sorted(((seconds, f"{file}::{name}") for seconds, file, name in test_times(reports)), reverse=True)[:k]


def file_seconds(reports: list[Path]) -> dict[str, float]:
    """Each test file's seconds (its tests' setup, call and teardown) in pytest's JUnit XML reports."""
    out: dict[str, float] = {}
    for seconds, file, _ in test_times(reports):
        out[file] = out.get(file, 0.0) + seconds
    return out


def save_durations(reports: list[Path]) -> None:
    seconds = file_seconds(reports)
    if not seconds:
        print("(no report to take the durations from)")
        return
    ordered = dict(sorted(((name, round(s, 1)) for name, s in seconds.items()), key=lambda kv: (-kv[1], kv[0])))
    DURATIONS.write_text(json.dumps(ordered, indent=1) + "\n", encoding="utf-8")
    print(f"=== wrote {len(ordered)} files' seconds to {DURATIONS.relative_to(ROOT)}")


def run_phase(label: str, args: list[str]) -> tuple[int, float]:
    print(f"\n=== {label}: pytest {' '.join(args)}", flush=True)
    start = time.monotonic()
    status = subprocess.call([sys.executable, "-m", "pytest", *args], cwd=ROOT)
    seconds = time.monotonic() - start
    print(f"=== {label}: exit status {status} in {seconds:.0f} s", flush=True)
    return status, seconds


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Run the whole suite: the parallel phase, then the serial one.")
    parser.add_argument("--workers", default=os.environ.get("AE_TEST_WORKERS", "2"),
                        help="pytest-xdist workers for the first phase (default 2, or AE_TEST_WORKERS; 0 runs it in "
                             "one process)")
    parser.add_argument("--slowest", type=int, default=25, help="how many of the slowest tests to list at the end")
    parser.add_argument("--save-durations", action="store_true",
                        help=f"write each file's seconds in this run to {DURATIONS.relative_to(ROOT)} (the order the "
                             "workers take the files in)")
    ours, rest = parser.parse_known_args(argv)
    # OpenMP threads that wait for work sleep at once instead of spinning: the workers, the app servers, the CLI runs
    # and the browsers share 2 cores, and spinning threads (torch's in a server, scikit-learn's t-SNE, numba's) took
    # the cores from the process they waited for. With two busy processes beside it (29 Nov): a 300-point t-SNE
    # 13.4 -> 3.4 s, 300 small torch matmuls 5.2 -> 3.4 s; on a quiet machine both the same (1.5 s, 1.7 -> 1.6 s).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    marker, rest = split_marker(rest)
    kept = os.environ.get("AE_TEST_REPORTS")  # a folder that keeps both phases' JUnit XML reports
    with tempfile.TemporaryDirectory(prefix="ae-tests-") as folder:
        if kept:
            Path(kept).mkdir(parents=True, exist_ok=True)
        reports = [Path(kept or folder) / "parallel.xml", Path(kept or folder) / "serial.xml"]
        workers = worker_args(ours.workers)
        phases = [("parallel phase", [*workers, "-m", phase_marker("not serial", marker),
                                      f"--junitxml={reports[0]}", *rest]),
                  ("serial phase", ["-m", phase_marker("serial", marker), f"--junitxml={reports[1]}",
                                    *without_workers(rest)])]
        for report in reports:  # a phase that writes none must not leave an older run's figures
            report.unlink(missing_ok=True)
        results = [run_phase(label, args) for label, args in phases]
        if ours.save_durations:
            save_durations(reports)
        print(f"\n=== the {ours.slowest} slowest tests (setup, call and teardown; both phases)")
        for seconds, name in slowest(reports, ours.slowest):
            print(f"{seconds:8.1f} s  {name}")
    print("\n=== " + "; ".join(f"{label}: exit {status}, {seconds:.0f} s"
                                for (label, _), (status, seconds) in zip(phases, results)))
    for status, _ in results:
        if status not in (0, NO_TESTS):
            return status
    if all(status == NO_TESTS for status, _ in results):
        return NO_TESTS
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
