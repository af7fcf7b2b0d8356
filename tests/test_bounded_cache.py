"""model_core.memory.BoundedCache: the server's one cache of traces, bounded by the bytes they hold."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from model_core.memory import BoundedCache


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
    cache = BoundedCache(lambda: 1e9, ttl_s=0.05)

    def fail():
        raise ValueError("no")

    with pytest.raises(ValueError):
        cache.get("x", fail)
    assert "x" not in cache and not cache._building
    cache.get("x", lambda: _array(1))
    time.sleep(0.1)
    cache.get("y", lambda: _array(1))  # any access drops what was unused for longer than the ttl
    assert "x" not in cache and "y" in cache


def test_two_threads_asking_for_the_same_key_build_it_once():
    cache = BoundedCache(lambda: 1e9)
    calls = []
    started = threading.Event()

    def slow():
        calls.append(1)
        started.set()
        time.sleep(0.2)
        return _array(1)

    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("k", slow))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(results) == 3 and all(r is results[0] for r in results)


def test_sizes_come_from_nbytes_an_attribute_or_a_method():
    from model_core.memory import nbytes_of

    class Compact:  # model_core.compact.CompactTrace has nbytes() as a method
        def nbytes(self) -> int:
            return 123

    assert nbytes_of(_array(2)) == 2_000_000 and nbytes_of(Compact()) == 123 and nbytes_of("text") == 0
