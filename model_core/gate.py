"""The route's gate: at most ``AE_MAX_RUNS`` model passes at once, the others queued first in, first out.

Every model pass (a full trace, a compact one, a corpus batch, a masked run, both walks) holds ``GATE.turn()`` from
its forward pass until its tensors are numpy arrays, so memory holds one pass per turn in flight (about 0.9 GB for
SmolLM2 at 400 tokens) and a user waits for the passes ahead of them, not beside them. A waiting thread is told its
place through the callback it set with ``waiting_with``; an exception the callback raises (the user left the
page) takes its ticket out of the queue, so a pass nobody waits for never runs. A running pretrained model's pass
meets ``checkpoint`` at every layer, where the stop check (the process's, ``set_stop_check``: the app's ends a run
that Streamlit was asked to stop; or its thread's own, ``stopping_with``) may end it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

from model_core.settings import load_settings

WAIT_TICK_S = 0.25
"""How often a waiting thread's callback is called (and the limit read again)."""
RECENT_TURNS = 8
"""How many of the last turns' lengths the wait estimate reads (``Gate.wait_estimate_s``)."""

Waiting = Callable[[int, int], None]
"""Called while waiting with (place, running): place 1 means next; running is how many passes hold a turn."""

_LOCAL = threading.local()  # this thread's waiting callback and stop check
_PROCESS_CHECK: Callable[[], None] | None = None  # the stop check of a thread that has none (set_stop_check)


class Gate:
    """A first-in, first-out queue in front of at most ``max_runs`` passes at once.

    Args:
        max_runs: how many passes may run at once, or a function that says it (read again at every wake-up, so a
            changed setting applies to the next turn).
    """

    def __init__(self, max_runs: int | Callable[[], int]):
        self._max_runs = max_runs
        self._cond = threading.Condition()
        self._queue: deque[object] = deque()  # tickets of the waiting threads, first in front
        self._running = 0
        self._held = threading.local()  # how deep this thread is in turns it holds (re-entrance)
        self._recent: deque[float] = deque(maxlen=RECENT_TURNS)  # seconds each of the last turns was held
        self._started: dict[object, float] = {}  # when each turn held now began (time.monotonic)

    @property
    def max_runs(self) -> int:
        value = self._max_runs() if callable(self._max_runs) else self._max_runs
        if int(value) < 1:
            raise ValueError(f"max_runs={value} must be at least 1 (AE_MAX_RUNS).")
        return int(value)

    @property
    def held_here(self) -> bool:
        """Whether the calling thread holds a turn now (a check that a pass runs under the gate)."""
        return getattr(self._held, "depth", 0) > 0

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Wait in first-in, first-out order for one of max_runs slots and hold it for the block. While waiting,
        call this thread's waiting callback (see waiting_with) every ~0.25 s with (place, running) where place 1
        means next; an exception the callback raises leaves the queue and propagates, so the pass never runs.
        Re-entrant: a thread already holding a turn passes straight through (a walk that builds a trace)."""
        depth = getattr(self._held, "depth", 0)
        if depth:
            self._held.depth = depth + 1
            try:
                yield
            finally:
                self._held.depth = depth
            return
        ticket = self._wait()
        self._held.depth = 1
        started = self._started[ticket]
        try:
            yield
        finally:
            self._held.depth = 0
            with self._cond:
                del self._started[ticket]
                self._recent.append(time.monotonic() - started)
                self._running -= 1
                self._cond.notify_all()

    def _wait(self) -> object:
        """Queue a ticket and return it holding a slot, its start noted; on any exception the ticket leaves and the
        next is woken."""
        ticket = object()
        callback: Waiting | None = getattr(_LOCAL, "callback", None)
        with self._cond:
            self._queue.append(ticket)
            try:
                told = None  # the last (place, running) the callback heard, and when
                last_call = 0.0
                while True:
                    if self._queue[0] is ticket and self._running < self.max_runs:
                        self._queue.popleft()
                        self._running += 1
                        self._started[ticket] = time.monotonic()
                        self._cond.notify_all()  # with max_runs > 1 the next in line may go too
                        return ticket
                    if callback is not None:
                        now = time.monotonic()
                        state = (self._queue.index(ticket) + 1, self._running)
                        if state != told or now - last_call >= WAIT_TICK_S:
                            told, last_call = state, now
                            self._cond.release()  # the callback may draw a page: never under the lock
                            try:
                                callback(*state)
                            finally:
                                self._cond.acquire()
                            continue  # the queue may have moved while the callback ran
                    self._cond.wait(WAIT_TICK_S)
            except BaseException:
                self._queue.remove(ticket)
                self._cond.notify_all()
                raise

    def wait_estimate_s(self, place: int, running: int) -> float | None:
        """About how long a waiter at ``place`` (1 = next) still waits while ``running`` passes hold a turn: the
        passes ahead of it at the median length of the last turns, and what is left of each running one (the median
        less the time it has run; half the median for one whose start this gate does not hold), shared among
        max_runs slots.

        None when there is nothing honest to say: before any turn has ended, or while a running pass has already run
        longer than the median (a 4,096-token pass after short ones: "about 1 s" would be wrong for its whole length).
        """
        now = time.monotonic()
        with self._cond:
            recent = sorted(self._recent)
            elapsed = [now - started for started in self._started.values()]
        if not recent:
            return None
        typical = recent[len(recent) // 2]
        if any(e > typical for e in elapsed):
            return None
        left = sum(typical - e for e in elapsed) + 0.5 * typical * max(0, running - len(elapsed))
        return (max(0, place - 1) * typical + left) / self.max_runs

    def snapshot(self) -> dict:
        """{"running": passes holding a turn, "waiting": tickets in the queue, "max_runs": the limit now}."""
        with self._cond:
            return {"running": self._running, "waiting": len(self._queue), "max_runs": self.max_runs}


@contextlib.contextmanager
def _for_this_thread(name: str, value: Callable[..., None]) -> Iterator[None]:
    """Set one of this thread's callbacks (``_LOCAL.<name>``) for the block, and put the one before back after it."""
    previous = getattr(_LOCAL, name, None)
    setattr(_LOCAL, name, value)
    try:
        yield
    finally:
        setattr(_LOCAL, name, previous)


def waiting_with(callback: Callable[[int, int], None]) -> contextlib.AbstractContextManager[None]:
    """Set this thread's waiting callback for the passes run inside the block."""
    return _for_this_thread("callback", callback)


def stopping_with(check: Callable[[], None]) -> contextlib.AbstractContextManager[None]:
    """Set this thread's stop check for the work run inside the block, in place of the process's
    (``set_stop_check``)."""
    return _for_this_thread("stop", check)


def set_stop_check(check: Callable[[], None] | None) -> None:
    """The process's stop check, for every thread that has not set its own with ``stopping_with``: ``checkpoint``
    calls it, and an exception it raises (the user stopped the run, or left) ends that work where it stands. The app
    sets Streamlit's (``ui.st_private.stop_if_asked``), which acts in a script thread only, so a fragment's rerun is
    stopped as a whole run is; the CLI and a notebook set none, and ``checkpoint`` does nothing there."""
    global _PROCESS_CHECK
    _PROCESS_CHECK = check


def current_stop_check() -> Callable[[], None] | None:
    """The check ``checkpoint`` calls in this thread now: its own (``stopping_with``), else the process's."""
    check = getattr(_LOCAL, "stop", None)
    return _PROCESS_CHECK if check is None else check


def checkpoint() -> None:
    """A point where long work that draws nothing may be stopped: every layer of a pretrained model's pass, every
    step of the composition scores. Calls ``current_stop_check()``, if there is one (nothing copied, nothing
    synchronised on a GPU)."""
    check = current_stop_check()
    if check is not None:
        check()


def _settings_max_runs() -> int:
    return int(load_settings().max_runs)


GATE = Gate(_settings_max_runs)
"""The process's one gate; its limit is ``Settings.max_runs`` (AE_MAX_RUNS), read at every wake-up."""
