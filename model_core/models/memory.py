"""Memory: give freed heap memory back to the operating system (glibc keeps it otherwise), and a cache of results
bounded by the bytes they hold."""

from __future__ import annotations

import ctypes
import threading
import time
import weakref
from collections import OrderedDict
from typing import Any, Callable, Generic, TypeVar

from model_core.gate import current_stop_check, stopping_with

K = TypeVar("K")
V = TypeVar("V")


def release_freed_memory() -> None:
    """``malloc_trim(0)``: return the free memory glibc's arenas hold; a no-op where there is no glibc.

    Forward passes of many shapes (one per padded batch, one per session's text) leave freed blocks
    in the allocator's arenas; without a trim a long corpus run or a server grows by the fragments.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def fixed_mmap_threshold(threshold: int = 1 << 20) -> None:
    """Serve every allocation of ``threshold`` bytes or more with its own mmap, returned to the OS when freed.

    glibc raises its mmap threshold each time a large block is freed (up to 32 MB), after which padded
    batches of many shapes are carved out of the heap and fragment it: a 20,000-text corpus run peaked
    24% above a 1,000-text one. A fixed threshold keeps the peak flat. A no-op where there is no glibc.
    """
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, threshold)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def nbytes_of(value: Any) -> int:
    """The bytes a cached result holds: its ``nbytes`` (traces, runs, arrays; a compact trace's is a method), else 0."""
    size = getattr(value, "nbytes", 0)
    return int((size() if callable(size) else size) or 0)


WAIT_POLL_S = 0.2
"""How often a thread waiting for another's build of the same key calls its ``wait`` hook."""


class _Building:
    """One key being built: the lock its builder holds, and how many threads are using it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0

    def build(self, build: Callable[[], V]) -> V:
        """``build()``, which the stop check (``model_core.gate.checkpoint``) ends only while no other thread waits
        for it: one session's Stop, or closed tab, does not throw away a result others wait for (the next of them
        would start it again from nothing); once they have left, it may."""
        outer = current_stop_check()
        if outer is None:
            return build()

        def check() -> None:
            if self.users <= 1:
                outer()

        with stopping_with(check):
            return build()


class BoundedCache(Generic[K, V]):
    """A thread-safe least-recently-used cache of immutable results, bounded by the bytes they hold.

    Past ``budget_bytes()`` the least recently used entries go, but the latest always stays, however large: the
    server's memory then holds the model, the libraries and about one budget of traces, not twelve traces. Entries
    unused for ``ttl_s`` go too. An entry that went out while something else still holds it (a session's page) is
    remembered weakly and comes back on its next request instead of being built again, so a second copy never
    sits beside it. Two threads asking for the same missing key build it once: the second waits, calling its
    ``wait`` hook every ``WAIT_POLL_S`` (where Streamlit can stop it). A build that raises (or that Streamlit stops)
    stores nothing; Streamlit's Stop ends a build only while nobody else waits for it (``_Building.build``).
    ``on_evict`` is called when entries go, so the caller can collect what they leave behind, and
    ``release_freed_memory`` hands freed memory back to the system after each build.
    """

    def __init__(self, budget_bytes: Callable[[], float], *, max_entries: int = 64, ttl_s: float | None = None,
                 size: Callable[[Any], int] = nbytes_of, on_evict: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._budget = budget_bytes
        self._clock = clock  # a test passes a fake one to expire entries without waiting
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._size = size
        self._on_evict = on_evict
        self._items: OrderedDict[K, tuple[V, int, float]] = OrderedDict()  # key -> (value, bytes, last used)
        self._gone: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # evicted, maybe still held
        self._lock = threading.Lock()
        self._building: dict[K, _Building] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached results."""
        return sum(size for _, size, _ in self._items.values())

    def _hit(self, key: K) -> tuple[bool, V | None]:
        """Under the lock: drop expired entries; (True, value) and mark it the most recently used, or (False, None).
        An evicted value that is still alive is taken back in."""
        now = self._clock()
        evicted = False
        if self._ttl_s is not None:
            for old in [k for k, (_, _, used) in self._items.items() if now - used > self._ttl_s]:
                self._forget(old)
                evicted = True
        if key in self._items:
            value, size, _ = self._items.pop(key)
        else:
            value = self._gone.pop(key, None)
            size = 0 if value is None else self._size(value)
        if value is not None:
            evicted = self._put(key, value, size, now) or evicted
        self._notify(evicted)
        return value is not None, value

    def get(self, key: K, build: Callable[[], V], wait: Callable[[], None] | None = None) -> V:
        """The cached result for ``key``, or ``build()``'s, stored. ``wait`` is called while another thread builds
        the same key; an exception it raises ends the wait."""
        with self._lock:
            found, value = self._hit(key)
            if found:
                return value  # type: ignore[return-value]
            building = self._building.setdefault(key, _Building())
            building.users += 1
        built = False
        try:
            while not building.lock.acquire(timeout=WAIT_POLL_S):
                if wait is not None:
                    wait()
            try:
                with self._lock:
                    found, value = self._hit(key)
                if not found:
                    value = building.build(build)
                    built = True
                    with self._lock:
                        self._notify(self._put(key, value, self._size(value), self._clock()))
            finally:
                building.lock.release()
        finally:
            with self._lock:
                building.users -= 1
                if building.users == 0 and self._building.get(key) is building:
                    del self._building[key]
        if built:
            release_freed_memory()  # what went out, and the pass's own buffers
        return value  # type: ignore[return-value]

    def _forget(self, key: K) -> None:
        """Under the lock: take ``key`` out, remembering its value weakly while something else holds it."""
        value, _, _ = self._items.pop(key)
        try:
            self._gone[key] = value
        except TypeError:  # not weakly referenceable (a bare array): nothing else can be sharing it through us
            pass

    def _put(self, key: K, value: V, size: int, now: float) -> bool:
        """Under the lock: store ``value`` as the most recently used entry, then evict; whether any entry went."""
        self._items[key] = (value, size, now)
        return self._evict()

    def _evict(self) -> bool:
        """Under the lock: drop the least recently used entries past the budget or the entry count, never the
        latest; whether any went."""
        budget = self._budget()
        total = self.nbytes
        evicted = False
        while len(self._items) > 1 and (total > budget or len(self._items) > self._max_entries):
            key = next(iter(self._items))
            total -= self._items[key][1]
            self._forget(key)
            evicted = True
        return evicted

    def _notify(self, evicted: bool) -> None:
        if evicted and self._on_evict is not None:
            self._on_evict()

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._gone.clear()
