"""The waiting page (ui/waiting.py): what it says, that the note goes when the turn comes, and that a pass the user
left is not run. The real queue in a browser is tests/test_gate_browser.py."""

from __future__ import annotations

import threading

import pytest
from streamlit.testing.v1 import AppTest

from ui.waiting import LEFT_KEY, LEFT_MESSAGE, queue_message

def test_queue_message_next_in_line():
    assert queue_message(1, 1) == "Waiting for the model: you are next in the queue (1 running)."


def test_queue_message_counts_the_passes_ahead():
    assert queue_message(3, 2) == "Waiting for the model: 2 passes ahead of you in the queue, 2 running."
    assert queue_message(2, 1) == "Waiting for the model: 1 pass ahead of you in the queue, 1 running."


def test_queue_message_says_about_how_long_is_left():
    assert queue_message(3, 1, 7.4) == ("Waiting for the model: 2 passes ahead of you in the queue, 1 running. "
                                        "About 7 s to go.")
    assert queue_message(1, 1, 0.2).endswith("(1 running). About 1 s to go.")  # never "0 s"


def _script():
    import streamlit as st

    from ui.waiting import in_turn

    built = in_turn("the pass", lambda: "built")
    st.write(f"result: {built}")


@pytest.fixture
def one_run(monkeypatch):
    monkeypatch.setenv("AE_MAX_RUNS", "1")


def _hold_gate(release: threading.Event, order: list) -> threading.Thread:
    """Another session's pass: holds the gate's one turn until ``release`` is set, then notes that it let go."""
    from model_core.gate import GATE

    held = threading.Event()

    def hold() -> None:
        with GATE.turn():
            held.set()
            assert release.wait(30)  # a failsafe only: the waiting page's note sets it
            order.append("released")

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(30)
    return thread


def _built_script():
    import streamlit as st

    from ui.waiting import in_turn

    order = st.session_state["order"]
    built = in_turn("the pass", lambda: order.append("built") or "built")
    st.write(f"result: {built}")


def test_the_note_goes_when_the_turn_comes(one_run, monkeypatch):
    from ui.waiting import WaitingNote

    shown, order, release = [], [], threading.Event()
    show = WaitingNote.show

    def recorded(self, place, running):
        shown.append((place, running))
        order.append("noted")
        show(self, place, running)
        release.set()  # the other pass ends only once this page has said it waits

    monkeypatch.setattr(WaitingNote, "show", recorded)
    at = AppTest.from_function(_built_script)
    at.session_state["order"] = order
    holder = _hold_gate(release, order)
    at.run(timeout=30)
    holder.join()
    # It waited for the other pass (the note may be shown again while the holder wakes), then ran its own.
    assert order[0] == "noted" and order.index("released") < order.index("built")
    assert shown[0] == (1, 1)  # while it waited, the note said: next in the queue, 1 running
    assert [m.value for m in at.markdown] == ["result: built"]
    assert not at.info and not at.button  # the note and its button are cleared once the pass runs


def test_a_left_pass_is_not_run(one_run):
    at = AppTest.from_function(_script)
    at.session_state[LEFT_KEY] = "the pass"
    at.run(timeout=30)
    assert [m.value for m in at.info] == [LEFT_MESSAGE]
    assert not at.markdown  # the build never ran
    at.button[0].click().run(timeout=30)  # "Join the queue again"
    assert [m.value for m in at.markdown] == ["result: built"]
    assert not at.info


def test_leaving_another_pass_does_not_stop_this_one(one_run):
    at = AppTest.from_function(_script)
    at.session_state[LEFT_KEY] = "an older pass"
    at.run(timeout=30)
    assert [m.value for m in at.markdown] == ["result: built"]
    assert LEFT_KEY not in at.session_state
