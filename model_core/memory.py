"""Memory: give freed heap memory back to the operating system (glibc keeps it otherwise), and a cache of results
bounded by the bytes they hold."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


def release_freed_memory() -> None:
    """``malloc_trim(0)``: return the free memory glibc's arenas hold; a no-op where there is no glibc.

    Forward passes of many shapes (one per padded batch, one per session's text) leave freed blocks
    in the allocator's arenas; without a trim a long corpus run or a server grows by the fragments.
    """
    try:
        import ctypes

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
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, threshold)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def nbytes_of(value: Any) -> int:
    """The bytes a cached result holds: its ``nbytes`` (traces, runs, arrays; a compact trace's is a method), else 0."""
    size = getattr(value, "nbytes", 0)
    return int((size() if callable(size) else size) or 0)


class BoundedCache(Generic[K, V]):
    """A thread-safe least-recently-used cache of immutable results, bounded by the bytes they hold.

    Past ``budget_bytes()`` the least recently used entries go, but the latest always stays, however large: the
    server's memory then holds the model, the libraries and about one budget of traces, not twelve traces. Entries
    unused for ``ttl_s`` go too. Two threads asking for the same missing key build it once (the second waits);
    a build that raises (or that Streamlit stops) stores nothing. What goes out is freed once no session holds it,
    and ``release_freed_memory`` hands it back to the system.
    """

    def __init__(self, budget_bytes: Callable[[], float], *, max_entries: int = 64, ttl_s: float | None = None,
                 size: Callable[[Any], int] = nbytes_of) -> None:
        self._budget = budget_bytes
        self._max_entries = max_entries
        self._ttl_s = ttl_s
        self._size = size
        self._items: OrderedDict[K, tuple[V, int, float]] = OrderedDict()  # key -> (value, bytes, last used)
        self._lock = threading.Lock()
        self._building: dict[K, threading.Lock] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached results."""
        return sum(size for _, size, _ in self._items.values())

    def _hit(self, key: K) -> tuple[bool, V | None]:
        """Under the lock: drop expired entries; (True, value) and mark it used, or (False, None)."""
        now = time.monotonic()
        if self._ttl_s is not None:
            for old in [k for k, (_, _, used) in self._items.items() if now - used > self._ttl_s]:
                del self._items[old]
        if key not in self._items:
            return False, None
        value, size, _ = self._items[key]
        self._items[key] = (value, size, now)
        self._items.move_to_end(key)
        return True, value

    def get(self, key: K, build: Callable[[], V]) -> V:
        """The cached result for ``key``, or ``build()``'s, stored."""
        with self._lock:
            found, value = self._hit(key)
            if found:
                return value  # type: ignore[return-value]
            building = self._building.setdefault(key, threading.Lock())
        with building:
            with self._lock:
                found, value = self._hit(key)
            if found:
                return value  # type: ignore[return-value]
            try:
                value = build()
                with self._lock:
                    self._items[key] = (value, self._size(value), time.monotonic())
                    self._evict()
            finally:
                with self._lock:
                    self._building.pop(key, None)
        release_freed_memory()  # what went out, and the pass's own buffers
        return value

    def _evict(self) -> None:
        budget = self._budget()
        total = self.nbytes
        while len(self._items) > 1 and (total > budget or len(self._items) > self._max_entries):
            _, (_, size, _) = self._items.popitem(last=False)
            total -= size

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
