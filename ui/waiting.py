"""The waiting page: while a session's model pass waits for the gate (``model_core.gate``), its place in the
queue, live, and a button to leave the queue; a pass the user left is not run."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

import streamlit as st

from model_core.gate import GATE, waiting_with

R = TypeVar("R")

LEFT_KEY = "gate_left"
"""Session state: the key of the pass the user left the queue of (``in_turn``'s ``key``)."""
LEFT_MESSAGE = ("You left the queue, so the model did not run on this input. Change the text, or join the queue "
                "again.")
RUNNING = "Running the model…"
"""The spinner of a pass once its turn came (while it waits, the queue's note is the only thing shown)."""


def queue_message(place: int, running: int, estimate_s: float | None = None) -> str:
    """What a waiting page says: ``place`` in the queue (1 = next), how many passes are ``running``, and about how
    long it still waits (``estimate_s``, from ``Gate.wait_estimate_s``; left out when None).

    >>> queue_message(3, 1)
    'Waiting for the model: 2 passes ahead of you in the queue, 1 running.'
    >>> queue_message(3, 1, 7.4)
    'Waiting for the model: 2 passes ahead of you in the queue, 1 running. About 7 s to go.'
    """
    ahead = max(0, place - 1)
    runs = f"{running} running" if running else "none running yet"
    eta = "" if estimate_s is None else f" About {max(1, round(estimate_s))} s to go."
    if ahead == 0:
        return f"Waiting for the model: you are next in the queue ({runs}).{eta}"
    passes = "1 pass" if ahead == 1 else f"{ahead} passes"
    return f"Waiting for the model: {passes} ahead of you in the queue, {runs}.{eta}"


def queue_text(place: int, running: int) -> str:
    """``queue_message`` with the gate's estimate of the wait (the waiting callbacks' text)."""
    return queue_message(place, running, GATE.wait_estimate_s(place, running))


def _leave(key: str) -> None:
    st.session_state[LEFT_KEY] = key


def _join_again() -> None:
    st.session_state.pop(LEFT_KEY, None)


def _widget_key(prefix: str, key: str) -> str:
    return f"{prefix}_{hashlib.sha1(key.encode()).hexdigest()[:12]}"


class Note(Protocol):
    """What shows a pass's place in the queue: ``show`` while it waits (the gate's callback), ``clear`` at its turn."""

    def show(self, place: int, running: int) -> None: ...

    def clear(self) -> None: ...


class WaitingNote:
    """The note with the queue place and the "Leave the queue" button, drawn where the page is at its first wait
    (nothing is drawn when the pass never waits) and cleared when the turn comes."""

    def __init__(self, key: str) -> None:
        self.key = key
        self._slot: Any = None
        self._note: Any = None
        self._shown = ""

    def show(self, place: int, running: int) -> None:
        """The gate's waiting callback, in the script thread: every call is a point where Streamlit can end the run
        (a click on "Leave the queue", a new text, a closed tab), which takes this pass out of the queue."""
        _ = LEFT_KEY in st.session_state  # a Streamlit call even when the text is unchanged: the run's yield point
        if self._slot is None:
            self._slot = st.empty()
            with self._slot.container():
                self._note = st.empty()
                st.button("Leave the queue", key=_widget_key("gate_leave", self.key), on_click=_leave,
                          args=(self.key,), icon=":material/logout:")
        message = queue_text(place, running)
        if message != self._shown:
            self._note.info(message, icon=":material/hourglass_top:")
            self._shown = message

    def clear(self) -> None:
        if self._slot is not None:
            self._slot.empty()
            self._slot = self._note = None
            self._shown = ""


def stop_if_left(key: str) -> None:
    """Stop the page with the "left" message when the user left the queue of the pass ``key``; otherwise forget an
    older pass the user left (they have moved on)."""
    left = st.session_state.get(LEFT_KEY)
    if left is None:
        return
    if left != key:
        st.session_state.pop(LEFT_KEY, None)
        return
    st.info(LEFT_MESSAGE, icon=":material/logout:")
    st.button("Join the queue again", key=_widget_key("gate_join", key), on_click=_join_again, type="primary",
              icon=":material/replay:")
    st.stop()


@contextmanager
def queue_turn(show: Callable[[int, int], None], served: Callable[[], None]) -> Iterator[None]:
    """Hold this thread's turn of the gate: ``show(place, running)`` while it waits, ``served()`` when the turn comes.

    The route takes the same turn again inside the pass (the gate is re-entrant per thread, so that costs no wait);
    taking it here is how the page learns the moment its turn comes. An exception from ``show`` (Streamlit ending
    the run) leaves the queue, and the pass never runs.
    """
    with waiting_with(show), GATE.turn():
        served()
        yield


def in_turn(key: str, build: Callable[[], R], note: Note | None = None) -> R:
    """``build()`` (one model pass, on a cache miss) in its turn of the gate, with a waiting note while it waits and
    a ``RUNNING`` spinner once its turn came.

    Call it inside a cache's build function, so that a cached result never waits. ``key`` names the pass, for the
    "Leave the queue" button: a pass the user left is not run, and the page says so (``stop_if_left``). ``note``
    replaces the default ``WaitingNote`` (the compact trace shows the queue in its progress bar). ``build`` must not
    wait for another session's result (a cache entry being built): it would hold the gate meanwhile.
    """
    stop_if_left(key)
    shown = note or WaitingNote(key)
    with queue_turn(shown.show, shown.clear), (st.spinner(RUNNING) if note is None else contextlib.nullcontext()):
        return build()
