"""The stop check (``model_core.gate``): the process's, or a thread's own for a block; a model pass meets it at every
layer, so a Stop ends the pass there and gives its turn at the gate back."""

from __future__ import annotations

import threading

import pytest

from model_core import TraceRequest, build_trace
from model_core.gate import GATE, checkpoint, current_stop_check, set_stop_check, stopping_with


class Stopped(Exception):
    """The user pressed Stop."""


def _counting_check(stop_after: int):
    """A stop check that raises on its ``stop_after``-th call; ``calls`` counts them."""
    calls = []

    def check() -> None:
        calls.append(1)
        if len(calls) >= stop_after:
            raise Stopped
    return check, calls


def test_a_stop_check_is_this_threads_alone_and_set_for_its_block():
    check, calls = _counting_check(10**6)
    checkpoint()  # none set: nothing
    with stopping_with(check):
        checkpoint()
        seen = []
        other = threading.Thread(target=lambda: seen.append(checkpoint()))  # another thread has none
        other.start()
        other.join(5)
        with stopping_with(lambda: None):  # a nested one replaces it for its block only
            checkpoint()
        checkpoint()
    checkpoint()
    assert len(calls) == 2 and seen == [None]


def test_a_stop_check_ends_a_model_pass_at_a_layer_and_frees_the_gate(tiny_decoders):
    """The check raises at the second layer's attention: the pass ends there (the exception reaches the caller),
    its turn at the gate is given back, and the same request then runs whole."""
    request = TraceRequest("pretrained", "The cat sat on the mat and watched the flies.",
                           model_id=str(tiny_decoders["llama"]))
    build_trace(request)  # loaded and warm
    check, calls = _counting_check(2)
    with pytest.raises(Stopped), stopping_with(check):
        build_trace(request)
    assert len(calls) == 2  # the first layer's attention ran; the second's stopped the pass
    assert GATE.snapshot()["running"] == 0 and not GATE.held_here
    trace = build_trace(request)
    assert trace.weights.shape[0] == trace.n_layers


def test_the_process_stop_check_serves_every_thread_without_its_own():
    """The app sets one check for the process (a fragment's rerun runs in a thread app.py never ran in); a thread's
    own check (``stopping_with``) replaces it for its block."""
    check, calls = _counting_check(10**6)
    set_stop_check(check)
    try:
        checkpoint()
        other = threading.Thread(target=checkpoint)
        other.start()
        other.join(5)
        with stopping_with(lambda: None):
            checkpoint()
        assert current_stop_check() is check
    finally:
        set_stop_check(None)
    checkpoint()
    assert len(calls) == 2 and current_stop_check() is None
