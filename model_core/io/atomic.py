"""Writes that Ctrl+C does not cut in half.

A SIGINT that lands inside ``np.savez`` or a parquet writer raises KeyboardInterrupt in the middle of the zip; the
zip's own cleanup then fails ("Can't close the ZIP file while there is an open writing handle") and that ValueError
replaces the interrupt, so a run that should stop cleanly with "--resume" in its message ends with an error instead.
Inside ``uninterrupted()`` the signal waits until the write is done, then stops the run as it would have.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Hold SIGINT for the block; raise it again, under the previous handler, when the block ends.

    Off the main thread (where Python runs no signal handler) it is a plain block.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:  # delivered again under the previous disposition: a handler runs, a default ends, an ignore ignores
        signal.raise_signal(signal.SIGINT)
