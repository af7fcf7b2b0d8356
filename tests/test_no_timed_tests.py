"""No test times itself or orders threads with ``sleep``: on a loaded 2-core runner both are flaky and measure
nothing reliable. Tests synchronise with events, barriers or a fake clock, and wait for a condition with
``harness.waits.wait_until``; speed claims live in ``bench/``, which prints figures."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
CLOCKS = {"perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns", "process_time", "time", "time_ns"}


def _called(node: ast.AST) -> str | None:
    """The name a call calls (``time.sleep`` -> "sleep"), or None."""
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute):
            return func.attr
        if isinstance(func, ast.Name):
            return func.id
    return None


def _reads_clock(node: ast.AST, timed: set[str]) -> bool:
    """Whether ``node`` reads a clock, directly or through a name assigned from one."""
    for sub in ast.walk(node):
        if _called(sub) in CLOCKS and isinstance(sub.func, ast.Attribute) and \
                isinstance(sub.func.value, ast.Name) and sub.func.value.id == "time":
            return True
        if isinstance(sub, ast.Name) and sub.id in timed:
            return True
    return False


def violations(source: str, name: str) -> list[str]:
    """Each ``sleep`` call, and each assert that compares a clock reading, in one module's source."""
    tree = ast.parse(source)
    found = []
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        timed: set[str] = set()
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and _reads_clock(node.value, timed):
                timed |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(scope):
            if _called(node) == "sleep":
                found.append(f"{name}:{node.lineno}: sleep()")
            if isinstance(node, ast.Assert) and _reads_clock(node.test, timed):
                found.append(f"{name}:{node.lineno}: an assert on a clock reading")
    return sorted(set(found))


def test_no_test_sleeps_or_asserts_a_duration():
    found = []
    for path in sorted(TESTS.glob("*.py")):
        found += violations(path.read_text(), path.name)
    assert found == [], "\n".join(found)


@pytest.mark.parametrize("source", [
    "import time\ndef test_x():\n    time.sleep(0.1)\n",
    "from time import sleep\ndef test_x():\n    sleep(1)\n",
    "import time\ndef test_x():\n    start = time.perf_counter()\n    run()\n    assert time.perf_counter() - start < 1\n",
    "import time\ndef test_x():\n    t0 = time.monotonic()\n    run()\n    took = time.monotonic() - t0\n"
    "    assert took < 0.5\n",
])
def test_the_scan_finds_a_timed_test(source):
    assert violations(source, "example.py")


def test_the_scan_lets_events_and_fake_clocks_pass():
    source = ("import threading\ndef test_x():\n    done = threading.Event()\n    now = [0.0]\n"
              "    assert done.wait(30)\n    assert now[0] < 1\n")
    assert violations(source, "example.py") == []


def test_the_remote_users_read_the_pages_own_words():
    """harness.protocol spots a user in line by the page's own texts: they must stay the same words."""
    from harness import protocol
    from ui.waiting import RUNNING, queue_message

    assert protocol.RUNNING == RUNNING
    assert queue_message(1, 1).startswith(protocol.QUEUE_PREFIX) and queue_message(3, 2, 4.0).startswith(
        protocol.QUEUE_PREFIX)
