"""A fresh server's first run goes alone; the sessions that arrive meanwhile wait for it, then run side by side
(ui/starting.py: ten first visitors at once used to meet transformers half-imported)."""

from __future__ import annotations

import threading

import pytest

from ui import starting


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(starting, "_first_run_done", False)
    monkeypatch.setattr(starting, "_imported", False)
    monkeypatch.setattr(starting, "_IMPORTING", threading.Lock())


def test_sessions_wait_for_the_first_run_then_run_together(fresh):
    first_inside, release_first = threading.Event(), threading.Event()
    inside_while_first_ran: list[str] = []
    both_inside = threading.Barrier(2, timeout=10)  # breaks (raises) unless the two later runs overlap

    def first() -> None:
        with starting.first_run():
            first_inside.set()
            release_first.wait(10)

    def later(name: str) -> None:
        with starting.first_run():
            if not release_first.is_set():
                inside_while_first_ran.append(name)
            both_inside.wait()

    t1 = threading.Thread(target=first)
    t1.start()
    assert first_inside.wait(10)
    others = [threading.Thread(target=later, args=(n,)) for n in ("b", "c")]
    for t in others:
        t.start()
    others[0].join(0.3)
    assert others[0].is_alive() and others[1].is_alive(), "a session ran during the first run"
    release_first.set()
    for t in [t1, *others]:
        t.join(10)
    assert not any(t.is_alive() for t in [t1, *others]), "the later sessions did not run side by side"
    assert inside_while_first_ran == [] and not both_inside.broken


def test_a_first_run_that_raises_still_lets_the_others_through(fresh):
    with pytest.raises(RuntimeError):
        with starting.first_run():
            raise RuntimeError("st.rerun() on the first visit")
    assert starting._first_run_done
    assert starting._IMPORTING.acquire(blocking=False), "the lock was left held"


def test_the_note_shows_only_until_the_imports_are_done(fresh):
    with starting.heavy_imports():
        assert not starting._imported
    assert starting._imported and starting.first_run_note() is None
