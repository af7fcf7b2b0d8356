"""`make test`'s runner (scripts/run_tests.py): each file's seconds from the JUnit reports, and the order the
pytest-xdist workers take the files in (tests/conftest.py's ``longest_files_first``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import conftest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import run_tests  # noqa: E402

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_one" time="1.5"/>
<testcase classname="tests.test_a" name="test_two" time="2.0"/>
<testcase classname="tests.test_b" name="test_three" time="10.25"/>
</testsuite></testsuites>"""


def test_file_seconds_sums_each_files_tests(tmp_path):
    (tmp_path / "parallel.xml").write_text(REPORT)
    (tmp_path / "serial.xml").write_text("")  # a phase that wrote nothing
    seconds = run_tests.file_seconds([tmp_path / "parallel.xml", tmp_path / "serial.xml", tmp_path / "none.xml"])
    assert seconds == {"tests/test_a.py": 3.5, "tests/test_b.py": 10.25}


def test_save_durations_writes_the_longest_first(tmp_path, monkeypatch):
    (tmp_path / "parallel.xml").write_text(REPORT)
    monkeypatch.setattr(run_tests, "DURATIONS", tmp_path / "durations.json")
    monkeypatch.setattr(run_tests, "ROOT", tmp_path)
    run_tests.save_durations([tmp_path / "parallel.xml"])
    written = json.loads((tmp_path / "durations.json").read_text())
    assert list(written.items()) == [("tests/test_b.py", 10.2), ("tests/test_a.py", 3.5)]


def test_the_workers_take_the_longest_files_first_and_an_unknown_file_before_them():
    seconds = json.loads((ROOT / "tests" / "durations.json").read_text())
    long, short = max(seconds, key=seconds.get), min(seconds, key=seconds.get)
    items = [SimpleNamespace(nodeid=f"{short}::test_1"), SimpleNamespace(nodeid=f"{long}::test_1"),
             SimpleNamespace(nodeid=f"{short}::test_2"), SimpleNamespace(nodeid="tests/test_new.py::test_x"),
             SimpleNamespace(nodeid=f"{long}::test_2")]
    conftest.longest_files_first(items)
    assert [i.nodeid for i in items] == ["tests/test_new.py::test_x", f"{long}::test_1", f"{long}::test_2",
                                         f"{short}::test_1", f"{short}::test_2"]


def test_the_parallel_phase_keeps_that_order():
    """pytest-xdist would otherwise hand out the files with the most tests first (its loadscope reorder)."""
    assert run_tests.worker_args("2") == ["-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]
    assert run_tests.worker_args("1") == [] and run_tests.worker_args("0") == []


def test_durations_names_the_suites_files():
    """A file renamed or added is taken first, so that a stale list costs no more than xdist's own order; most of
    the list must still name real files."""
    seconds = json.loads((ROOT / "tests" / "durations.json").read_text())
    present = [name for name in seconds if (ROOT / name).exists()]
    assert len(present) >= 0.8 * len(seconds), sorted(set(seconds) - set(present))
