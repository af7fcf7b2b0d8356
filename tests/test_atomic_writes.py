"""Ctrl+C during a run's write waits for the write, then stops the run (model_core/io/atomic.py)."""

from __future__ import annotations

import os
import signal
import zipfile

import numpy as np
import pytest

from model_core.io.atomic import uninterrupted


@pytest.fixture(autouse=True)
def pythons_own_sigint_handler():
    """Python's own SIGINT handler, as a terminal's process has, whatever started this one: a process started in
    the background by a shell without job control inherits SIGINT ignored (and Ctrl+C could not reach it)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_sigint_inside_a_write_lands_after_it_and_the_file_is_whole(tmp_path):
    target = tmp_path / "arrays.npz"
    reached_the_end = False
    with pytest.raises(KeyboardInterrupt):
        with uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)  # delivered to Python's handler before the next bytecode
            np.savez(target, a=np.arange(100_000), b=np.ones((300, 300)))
            reached_the_end = True
    assert reached_the_end
    with zipfile.ZipFile(target) as z:
        assert z.testzip() is None
    assert np.load(target)["a"][-1] == 99_999
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_a_signal_the_block_runs_and_the_handler_is_restored():
    with uninterrupted():
        value = 1
    assert value == 1 and signal.getsignal(signal.SIGINT) is signal.default_int_handler
