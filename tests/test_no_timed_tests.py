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


def _clock_names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The names a module reads clocks by: modules (``time``, ``import time as t``) and functions imported from them
    (``from time import perf_counter``); ``datetime`` counts as a clock module too (``datetime.now()``)."""
    modules, functions = {"time"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.asname or alias.name for alias in node.names if alias.name in ("time", "datetime")}
        elif isinstance(node, ast.ImportFrom) and node.module in ("time", "datetime"):
            for alias in node.names:
                (functions if alias.name in CLOCKS else modules).add(alias.asname or alias.name)
    return modules, functions


def _reads_clock(node: ast.AST, timed: set[str], clocks: tuple[set[str], set[str]]) -> bool:
    """Whether ``node`` reads a clock, directly or through a name assigned from one."""
    modules, functions = clocks
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            if isinstance(func, ast.Name) and func.id in functions:
                return True
            if isinstance(func, ast.Attribute) and (func.attr in CLOCKS or func.attr in ("now", "utcnow")):
                owner = func.value
                while isinstance(owner, ast.Attribute):  # datetime.datetime.now()
                    owner = owner.value
                if isinstance(owner, ast.Name) and owner.id in modules:
                    return True
        if isinstance(sub, ast.Name) and sub.id in timed:
            return True
    return False


def _targets(node: ast.Assign | ast.AnnAssign | ast.AugAssign) -> set[str]:
    """The names (and ``self.x`` attributes, by attribute name) an assignment writes, tuples unpacked."""
    found = set()
    for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name):
                found.add(sub.id)
            elif isinstance(sub, ast.Attribute):
                found.add(sub.attr)
    return found


def _own_nodes(scope: ast.AST):
    """The nodes of ``scope``, without those of the functions defined inside it (each is a scope of its own)."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))


def violations(source: str, name: str) -> list[str]:
    """Each ``sleep`` call, and each comparison with a clock reading, in one module's source."""
    tree = ast.parse(source)
    clocks = _clock_names(tree)
    found = []
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))]
    for scope in scopes:
        nodes = list(_own_nodes(scope))
        timed: set[str] = set()
        for _ in range(2):  # a name timed from another timed name (t1 = clock(); took = t1 - t0)
            for node in nodes:
                if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None and \
                        _reads_clock(node.value, timed, clocks):
                    timed |= _targets(node)
        for node in nodes:
            if _called(node) == "sleep":
                found.append(f"{name}:{node.lineno}: sleep()")
            if isinstance(node, ast.Compare) and _reads_clock(node, timed, clocks):
                found.append(f"{name}:{node.lineno}: a comparison with a clock reading")
    return sorted(set(found))


def test_no_test_sleeps_or_asserts_a_duration():
    found = []
    for path in sorted(TESTS.glob("*.py")):
        found += violations(path.read_text(), path.name)
    assert found == [], "\n".join(found)


@pytest.mark.parametrize("source", [
    "import time\ndef test_x():\n    time.sleep(0.1)\n",
    "from time import perf_counter as clock\ndef test_x():\n    t0 = clock()\n    run()\n    assert clock() - t0 < 1\n",
    "import time as t\ndef test_x():\n    start, n = t.monotonic(), 0\n    if t.monotonic() - start > 1:\n"
    "        pytest.fail('slow')\n",
    "from datetime import datetime\ndef test_x():\n    self.t0 = datetime.now()\n    assert (datetime.now() - self.t0)"
    ".seconds < 2\n",
    "from time import sleep\ndef test_x():\n    sleep(1)\n",
    # The clock goes in by name, so this example's text is not itself a timed assert to a line-by-line search.
    "import time\ndef test_x():\n    start = time.{0}()\n    run()\n    assert time.{0}() - start < 1\n".format(
        "perf_counter"),
    "import time\ndef test_x():\n    t0 = time.monotonic()\n    run()\n    took = time.monotonic() - t0\n"
    "    assert took < 0.5\n",
], ids=["time.sleep", "clock alias", "module alias, if", "datetime, attribute", "sleep alias", "assert on clock",
        "elapsed name"])
def test_the_scan_finds_a_timed_test(source):
    assert violations(source, "example.py")


def test_the_scan_lets_events_and_fake_clocks_pass():
    source = ("import threading\nimport time\ndef test_x():\n    done = threading.Event()\n    now = [0.0]\n"
              "    assert done.wait(30)\n    assert now[0] < 1\n"
              "def test_y():\n    took = time.perf_counter()\n    print(took)\n"
              "def test_z():\n    took = 3\n    assert took < 5\n")  # another function's clock name is not this one's
    assert violations(source, "example.py") == []


def test_the_remote_users_read_the_pages_queue_note():
    """harness.protocol spots a queued user by the start of the page's note: it must stay the same words."""
    from harness import protocol
    from ui.waiting import queue_message

    assert queue_message(1, 1).startswith(protocol.QUEUE_PREFIX) and queue_message(3, 2, 4.0).startswith(
        protocol.QUEUE_PREFIX)
