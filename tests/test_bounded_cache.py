"""model_core.models.memory.BoundedCache: the server's one cache of traces, bounded by the bytes they hold."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from model_core.models.memory import BoundedCache


def _array(mb: float) -> np.ndarray:
    return np.zeros(int(mb * 1e6), dtype=np.uint8)


def test_it_keeps_the_budget_least_recently_used_out_first_and_always_the_latest():
    cache = BoundedCache(lambda: 10e6)
    a = cache.get("a", lambda: _array(4))
    cache.get("b", lambda: _array(4))
    assert cache.get("a", lambda: _array(99)) is a  # a hit: not built again; "a" is now the most recent
    cache.get("c", lambda: _array(4))  # 12 MB > 10 MB: "b", the least recently used, goes
    assert "a" in cache and "b" not in cache and "c" in cache and cache.nbytes == 8_000_000
    cache.get("huge", lambda: _array(30))  # larger than the whole budget: everything else goes, it stays
    assert len(cache) == 1 and "huge" in cache and cache.nbytes == 30_000_000


def test_the_budget_is_read_at_each_insert_and_entries_are_bounded_too():
    budget = {"mb": 100.0}
    cache = BoundedCache(lambda: budget["mb"] * 1e6, max_entries=3)
    for key in "abcd":
        cache.get(key, lambda: _array(1))
    assert list(cache._items) == ["b", "c", "d"]
    budget["mb"] = 1.5
    cache.get("e", lambda: _array(1))
    assert list(cache._items) == ["e"]


def test_a_failed_build_stores_nothing_and_unused_entries_expire():
    now = [0.0]  # a fake clock: the entry expires without the test waiting for it
    cache = BoundedCache(lambda: 1e9, ttl_s=0.05, clock=lambda: now[0])

    def fail():
        raise ValueError("no")

    with pytest.raises(ValueError):
        cache.get("x", fail)
    assert "x" not in cache and not cache._building
    cache.get("x", lambda: _array(1))
    now[0] = 0.04
    cache.get("w", lambda: _array(1))  # within the ttl: "x" stays
    assert "x" in cache
    now[0] = 0.08
    cache.get("y", lambda: _array(1))  # any access drops what was unused for longer than the ttl
    assert "x" not in cache and "w" in cache and "y" in cache


def _waiting_hook(waiting: set, everyone_waits: threading.Event, n: int):
    """A ``wait`` hook that notes its thread and sets ``everyone_waits`` once ``n`` threads are waiting."""
    lock = threading.Lock()

    def hook() -> None:
        with lock:
            waiting.add(threading.get_ident())
            if len(waiting) >= n:
                everyone_waits.set()

    return hook


def test_two_threads_asking_for_the_same_key_build_it_once():
    cache = BoundedCache(lambda: 1e9)
    calls, waiting, everyone_waits = [], set(), threading.Event()
    hook = _waiting_hook(waiting, everyone_waits, 2)

    def slow():
        calls.append(1)
        # The build ends only once the two other threads are waiting for it (the timeout is a failsafe only).
        assert everyone_waits.wait(30), "the other threads never waited for the build"
        return _array(1)

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("k", slow, wait=hook))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(results) == 3 and all(r is results[0] for r in results)
    assert len(waiting) == 2  # the builder never waited; the other two did, and got its result


def test_sizes_come_from_nbytes_an_attribute_or_a_method():
    from model_core.models.memory import nbytes_of

    class Compact:  # model_core.compact.trace.CompactTrace has nbytes() as a method
        def nbytes(self) -> int:
            return 123

    assert nbytes_of(_array(2)) == 2_000_000 and nbytes_of(Compact()) == 123 and nbytes_of("text") == 0


class _Result:
    """A cached result that can be weakly referenced, as traces and runs are."""

    def __init__(self, mb: float) -> None:
        self.nbytes = int(mb * 1e6)


def test_an_entry_that_went_out_while_still_held_comes_back_instead_of_being_built_again():
    evictions = []
    cache = BoundedCache(lambda: 5e6, on_evict=lambda: evictions.append(1))
    held = cache.get("a", lambda: _Result(4))  # a session's page still holds it
    cache.get("b", lambda: _Result(4))  # over the budget: "a" goes out
    assert "a" not in cache and evictions
    assert cache.get("a", lambda: pytest.fail("built again")) is held  # back, not rebuilt; "b" goes out
    assert "a" in cache and "b" not in cache
    cache.get("c", lambda: _Result(4))
    del held  # nothing holds "a" any more: it is gone for good
    import gc

    gc.collect()
    assert cache.get("a", lambda: _Result(1)).nbytes == 1_000_000


def test_after_a_stopped_build_the_key_is_built_once_and_a_waiter_can_be_stopped():
    cache = BoundedCache(lambda: 1e9)
    release, building, waiting, everyone_waits = threading.Event(), threading.Event(), set(), threading.Event()
    hook = _waiting_hook(waiting, everyone_waits, 2)
    builds = []

    def stopped():
        builds.append("stopped")
        building.set()
        assert release.wait(30)
        raise RuntimeError("the run was stopped")

    def good():
        builds.append("good")
        return _Result(1)

    first = threading.Thread(target=lambda: pytest.raises(RuntimeError, cache.get, "k", stopped))
    first.start()
    assert building.wait(30)  # the first build holds the key before the waiters come
    results = []
    waiters = [threading.Thread(target=lambda: results.append(cache.get("k", good, wait=hook))) for _ in range(2)]
    for t in waiters:
        t.start()
    assert everyone_waits.wait(30)  # both wait for the first build
    release.set()  # the first build fails; one waiter builds, the other gets its result
    first.join()
    for t in waiters:
        t.join()
    assert builds == ["stopped", "good"] and results[0] is results[1] and not cache._building


def test_a_waiter_is_stopped_by_its_hook_while_the_build_goes_on():
    cache = BoundedCache(lambda: 1e9)
    started, finish = threading.Event(), threading.Event()

    class Stop(Exception):
        pass

    def stop():
        raise Stop

    def slow():
        started.set()
        assert finish.wait(30)  # a failsafe only: the test sets it once the waiter has been stopped
        return _Result(1)

    builder = threading.Thread(target=lambda: cache.get("s", slow))
    builder.start()
    assert started.wait(30)
    # Streamlit stops a waiting run through its hook. Were the hook not heeded, this call would wait for the build,
    # which ends only after it (or after the 30 s failsafe, and then "s" would be built here: not a Stop).
    with pytest.raises(Stop):
        cache.get("s", lambda: _Result(1), wait=stop)
    finish.set()
    builder.join()
    assert "s" in cache and not cache._building


def test_a_stop_ends_a_build_only_while_nobody_else_waits_for_it():
    """The builder's stop check (Streamlit's Stop, its tab closed) is asked at every checkpoint of the build. While a
    second thread waits for the same key, the build goes on and both get its result; alone, or once the waiter has
    left, the build stops at its next checkpoint and stores nothing."""
    from model_core.gate import checkpoint, stopping_with

    class Stopped(Exception):
        pass

    cache = BoundedCache(lambda: 1e9)
    pressed, started, waiter_in, waiter_leaves, waiter_gone = (threading.Event() for _ in range(5))
    steps, last = [], 300
    leave_at: list[int | None] = [None]

    def check() -> None:
        if pressed.is_set():
            raise Stopped

    def build():
        started.set()
        for step in range(1, last + 1):
            steps.append(step)
            checkpoint()
            if step == 50:  # the builder's user presses Stop, once the waiter (if any) waits
                assert waiter_in.wait(30)
                pressed.set()
            if step == leave_at[0]:  # the waiter leaves (its own Stop); the build goes on once it has gone
                waiter_leaves.set()
                assert waiter_gone.wait(30)
        return _Result(7)

    def hook() -> None:
        waiter_in.set()
        if waiter_leaves.is_set():
            raise Stopped

    def builder(key: str, out: list) -> None:
        with stopping_with(check):
            try:
                out.append(cache.get(key, build))
            except Stopped as exc:
                out.append(exc)

    def waiter(key: str, out: list) -> None:
        try:
            out.append(cache.get(key, lambda: _Result(0), wait=hook))
        except Stopped as exc:
            out.append(exc)

    def run(key: str, with_waiter: bool, leave: int | None = None) -> tuple[list, list]:
        for event in (pressed, started, waiter_in, waiter_leaves, waiter_gone):
            event.clear()
        steps.clear()
        leave_at[0] = leave
        got, waited = [], []
        first = threading.Thread(target=builder, args=(key, got))
        first.start()
        assert started.wait(30)
        if with_waiter:
            second = threading.Thread(target=waiter, args=(key, waited))
            second.start()
            second.join(30)  # it returns with the result, or leaves when told to
            waiter_gone.set()
        else:
            waiter_in.set()
        first.join(30)
        return got, waited

    # Someone waits: the Stop at step 50 does not end the shared build, and both get its result.
    got, waited = run("a", with_waiter=True)
    assert steps[-1] == last and got[0] is waited[0] and "a" in cache
    # Alone: the same Stop ends the build at its next checkpoint, and nothing is stored.
    got, _ = run("b", with_waiter=False)
    assert isinstance(got[0], Stopped) and steps[-1] == 51 and "b" not in cache
    # The waiter leaves at step 100: the build, asked to stop at step 50, stops at its next checkpoint.
    got, waited = run("c", with_waiter=True, leave=100)
    assert isinstance(got[0], Stopped) and isinstance(waited[0], Stopped)
    assert steps[-1] == 101 and "c" not in cache
