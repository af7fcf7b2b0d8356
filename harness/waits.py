"""One way for tests to wait for something another process or thread does: poll a condition until a deadline.

A test never orders threads with a bare ``sleep``; where it cannot be told by an event (a file another process
writes, a collector thread of the app's own), it waits for the condition itself, and a timeout fails it plainly.
"""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_S = 0.05


def wait_until(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    """Return once ``condition()`` is true; raise ``TimeoutError`` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not seen in {timeout_s:.0f} s")
        time.sleep(POLL_S)
