"""The route's gate: first in, first out; never more passes than allowed; a waiter told its place can leave, and a
pass it left never runs; re-entrant; and the builders' passes go through it."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from model_core import TraceRequest, build_trace
from model_core.families.hf import TransformersFamily
from harness.waits import wait_until
from model_core.gate import GATE, Gate, waiting_with


class Left(Exception):
    """The user left the page."""


def _wait_until(condition, timeout: float = 30.0) -> None:
    wait_until(condition, timeout, "the gate's state")


def _queue_in_order(gate: Gate, n: int, work) -> list[threading.Thread]:
    """Start ``n`` threads that take a turn and run ``work(i)``, each queued after the one before."""
    threads = []
    for i in range(n):
        t = threading.Thread(target=lambda i=i: _take_turn(gate, work, i))
        t.start()
        _wait_until(lambda i=i: gate.snapshot()["waiting"] == i + 1)
        threads.append(t)
    return threads


def _take_turn(gate: Gate, work, i: int) -> None:
    with gate.turn():
        work(i)


def test_waiters_are_served_first_in_first_out():
    gate, order, hold = Gate(1), [], threading.Event()
    holder = threading.Thread(target=lambda: _take_turn(gate, lambda _: hold.wait(30), -1))
    holder.start()
    _wait_until(lambda: gate.snapshot()["running"] == 1)
    threads = _queue_in_order(gate, 6, order.append)
    hold.set()
    for t in [holder, *threads]:
        t.join(5)
    assert order == list(range(6))


def _clocked_gate(monkeypatch, max_runs: int, start: float = 0.0) -> tuple[Gate, list[float]]:
    """A gate whose module reads a clock the test moves (``clock[0]``)."""
    import model_core.gate as gate_module

    clock = [start]
    monkeypatch.setattr(gate_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))  # this module's clock
    return Gate(max_runs), clock


@contextlib.contextmanager
def _held_elsewhere(gate: Gate):
    """Another thread holds a turn of ``gate`` for the block."""
    release = threading.Event()

    def hold() -> None:
        with gate.turn():
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    _wait_until(lambda: gate.snapshot()["running"] == 1)
    try:
        yield
    finally:
        release.set()
        holder.join(5)


def test_the_wait_estimate_reads_the_median_of_the_last_turns(monkeypatch):
    gate, clock = _clocked_gate(monkeypatch, 1, start=100.0)
    assert gate.wait_estimate_s(3, 1) is None  # no turn has ended yet: nothing to go by
    for seconds in (2.0, 9.0, 4.0):  # the median is 4 s
        with gate.turn():
            clock[0] += seconds
    assert gate.wait_estimate_s(1, 1) == pytest.approx(2.0)  # next: half of a running pass it has no start of
    assert gate.wait_estimate_s(3, 1) == pytest.approx(10.0)  # two passes ahead and half the running one
    assert gate.wait_estimate_s(1, 0) == pytest.approx(0.0)


def test_the_wait_estimate_shares_the_passes_among_the_slots(monkeypatch):
    gate, clock = _clocked_gate(monkeypatch, 2)
    with gate.turn():
        clock[0] += 6.0
    assert gate.wait_estimate_s(5, 2) == pytest.approx((4 + 1) * 6.0 / 2)


def test_the_wait_estimate_counts_what_is_left_of_the_running_pass(monkeypatch):
    gate, clock = _clocked_gate(monkeypatch, 1)
    with gate.turn():
        clock[0] += 4.0  # the median is 4 s
    with _held_elsewhere(gate):
        clock[0] += 1.0  # the running pass has run 1 s of its usual 4
        assert gate.wait_estimate_s(1, 1) == pytest.approx(3.0)
        assert gate.wait_estimate_s(3, 1) == pytest.approx(2 * 4.0 + 3.0)


def test_the_wait_estimate_says_nothing_once_the_running_pass_outlasts_the_usual(monkeypatch):
    gate, clock = _clocked_gate(monkeypatch, 1)
    with gate.turn():
        clock[0] += 2.0  # short turns so far: the median is 2 s
    with _held_elsewhere(gate):  # a long pass (a 4,096-token trace, say)
        clock[0] += 2.5
        assert gate.wait_estimate_s(1, 1) is None  # "about 0 s" would be wrong for as long as it runs
    assert gate.wait_estimate_s(2, 0) == pytest.approx(2.5)  # turns of 2 and 2.5 s: the upper median


def test_a_nested_turn_is_not_counted_as_a_turn_of_its_own(monkeypatch):
    gate, clock = _clocked_gate(monkeypatch, 1)
    with gate.turn():
        with gate.turn():  # the route's own turn inside the page's
            clock[0] += 1.0
        clock[0] += 1.0
    assert gate.wait_estimate_s(2, 0) == pytest.approx(2.0)


def test_never_more_passes_than_max_runs():
    gate, lock, now, peak = Gate(2), threading.Lock(), [0], [0]
    both_in = threading.Barrier(2, timeout=30)  # a turn ends only when the other slot's turn is in too

    def work(_):
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        both_in.wait()  # meanwhile six more threads press at the gate: a third turn would show in the peak
        with lock:
            now[0] -= 1

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda i: _take_turn(gate, work, i), range(24)))
    assert peak[0] == 2
    assert gate.snapshot() == {"running": 0, "waiting": 0, "max_runs": 2}


def test_max_runs_may_be_a_function_read_again_while_waiting():
    limit, hold = [1], threading.Event()
    gate = Gate(lambda: limit[0])
    holder = threading.Thread(target=lambda: _take_turn(gate, lambda _: hold.wait(30), -1))
    holder.start()
    _wait_until(lambda: gate.snapshot()["running"] == 1)
    ran = threading.Event()
    waiter = threading.Thread(target=lambda: _take_turn(gate, lambda _: ran.set(), 0))
    waiter.start()
    _wait_until(lambda: gate.snapshot()["waiting"] == 1)
    assert not ran.wait(0.3)
    limit[0] = 2  # a second slot opens: the waiter goes while the holder still runs
    assert ran.wait(30)
    hold.set()
    holder.join(5)
    waiter.join(5)


def test_a_waiter_hears_its_place_go_down_to_next():
    gate, hold = Gate(1), threading.Event()
    holder = threading.Thread(target=lambda: _take_turn(gate, lambda _: hold.wait(30), -1))
    holder.start()
    _wait_until(lambda: gate.snapshot()["running"] == 1)
    heard = []

    def last(i):  # the last of three waiters records what it is told
        with waiting_with(lambda place, running: heard.append((place, running))):
            _take_turn(gate, lambda _: None, i)

    releases = [threading.Event() for _ in range(2)]
    firsts = [threading.Thread(target=lambda e=e: _take_turn(gate, lambda _: e.wait(30), 0)) for e in releases]
    for k, t in enumerate(firsts):
        t.start()
        _wait_until(lambda k=k: gate.snapshot()["waiting"] == k + 1)
    listener = threading.Thread(target=last, args=(2,))
    listener.start()
    _wait_until(lambda: heard and heard[-1][0] == 3)
    hold.set()  # the holder leaves: each waiter moves up one place as the one ahead takes its turn
    _wait_until(lambda: heard[-1][0] == 2)
    releases[0].set()
    _wait_until(lambda: heard[-1][0] == 1)
    releases[1].set()
    for t in [holder, *firsts, listener]:
        t.join(5)
    places = [place for place, _ in heard]
    assert places[0] == 3 and places[-1] == 1
    assert places == sorted(places, reverse=True)  # never back
    assert all(running <= 1 for _, running in heard)  # 0 for a moment while the next one takes its turn


def test_a_waiter_whose_callback_raises_leaves_the_queue_and_never_runs():
    gate, hold, ran = Gate(1), threading.Event(), []
    holder = threading.Thread(target=lambda: _take_turn(gate, lambda _: hold.wait(30), -1))
    holder.start()
    _wait_until(lambda: gate.snapshot()["running"] == 1)
    leave, errors = threading.Event(), []

    def leaver():
        def told(place, running):
            if leave.is_set():
                raise Left
        try:
            with waiting_with(told):
                _take_turn(gate, ran.append, "left")
        except Left as exc:
            errors.append(exc)

    t_left = threading.Thread(target=leaver)
    t_left.start()
    _wait_until(lambda: gate.snapshot()["waiting"] == 1)
    t_after = threading.Thread(target=lambda: _take_turn(gate, ran.append, "after"))
    t_after.start()
    _wait_until(lambda: gate.snapshot()["waiting"] == 2)
    leave.set()
    t_left.join(5)
    assert len(errors) == 1 and gate.snapshot()["waiting"] == 1
    hold.set()
    for t in (holder, t_after):
        t.join(5)
    assert ran == ["after"]
    assert gate.snapshot() == {"running": 0, "waiting": 0, "max_runs": 1}


def test_a_thread_holding_a_turn_passes_straight_through():
    gate = Gate(1)
    with gate.turn():
        with gate.turn():  # a walk that builds a trace: no deadlock
            assert gate.snapshot()["running"] == 1
        assert gate.snapshot()["running"] == 1
    assert gate.snapshot()["running"] == 0


def test_an_exception_inside_the_turn_frees_the_slot():
    gate = Gate(1)
    with pytest.raises(RuntimeError):
        with gate.turn():
            raise RuntimeError("the pass failed")
    assert gate.snapshot() == {"running": 0, "waiting": 0, "max_runs": 1}
    with gate.turn():
        pass


def test_build_trace_from_three_threads_never_overlaps_forward_passes(tiny_decoders, monkeypatch):
    monkeypatch.setenv("AE_MAX_RUNS", "1")
    lock, now, peak, passes = threading.Lock(), [0], [0], [0]
    forward = TransformersFamily.forward

    def counted(self, *args, **kwargs):
        with lock:
            now[0] += 1
            passes[0] += 1
            peak[0] = max(peak[0], now[0])
        try:
            # Hold this pass until every other thread is queued at the gate (or, were the gate broken, in a pass).
            _wait_until(lambda: peak[0] > 1 or GATE.snapshot()["waiting"] == 3 - passes[0])
            return forward(self, *args, **kwargs)
        finally:
            with lock:
                now[0] -= 1

    monkeypatch.setattr(TransformersFamily, "forward", counted)
    requests = [TraceRequest("pretrained", text, model_id=str(tiny_decoders["llama"]))
                for text in ("time flies like an arrow", "fruit flies like a banana", "the river bank")]
    with ThreadPoolExecutor(max_workers=3) as pool:
        traces = list(pool.map(lambda r: build_trace(r, device="cpu"), requests))
    assert passes[0] == 3 and peak[0] == 1
    assert [t.n_tokens > 0 for t in traces] == [True] * 3
    assert GATE.snapshot()["running"] == 0 and GATE.snapshot()["max_runs"] == 1


def _passes(monkeypatch) -> list[dict]:
    """Record every Family.forward call: whether it was compact, and the gate's state when the model itself ran."""
    from model_core.families.custom import CustomFamily

    calls = []
    for cls in (TransformersFamily, CustomFamily):
        def wrapped(self, model, *args, _forward=cls.forward, **kwargs):
            call = {"compact": kwargs.get("compact", False)}
            calls.append(call)
            first = self.layers(model)[0] if isinstance(self, TransformersFamily) else model  # what surely runs
            def seen(*_):  # returns None: a pre-hook's value would replace the layer's inputs
                call.setdefault("gate", GATE.snapshot())
            hook = first.register_forward_pre_hook(seen)
            try:
                out = _forward(self, model, *args, **kwargs)
                # The builder's own turn must outlive the pass (its arrays become numpy under it): still held here.
                call["after"] = GATE.snapshot()["running"]
                return out
            finally:
                hook.remove()
        monkeypatch.setattr(cls, "forward", wrapped)
    return calls


TEXT = "time flies like an arrow and fruit flies like a banana"


def test_a_compact_trace_a_masked_run_and_the_block_walk_each_run_one_gated_pass_of_the_route(tiny_decoders,
                                                                                            monkeypatch):
    from model_core import build_walkthrough
    from model_core.analysis.masked_run import run_masked
    from model_core.compact.build import build_compact

    request = TraceRequest("pretrained", TEXT, model_id=str(tiny_decoders["llama"]))
    trace = build_trace(request, device="cpu")
    calls = _passes(monkeypatch)
    build_compact(request, device="cpu")
    mask = trace.head_mask.copy()
    mask[0, 1] = False
    run_masked(request, trace, mask)
    build_walkthrough(request, 1, trace, device="cpu")
    assert [c["compact"] for c in calls] == [True, False, False]
    # While the model runs, its pass holds the one turn: none runs beside it, none runs outside the gate.
    assert [c["gate"]["running"] for c in calls] == [1, 1, 1]
    assert [c["after"] for c in calls] == [1, 1, 1]  # each builder held its turn around the pass


def test_the_encoder_walk_and_a_corpus_batch_run_gated_passes_of_the_route(monkeypatch):
    import torch

    from model_core import build_walkthrough
    from model_core.corpus import CorpusModel

    request = TraceRequest("custom", TEXT, num_hidden_layers=2, num_attention_heads=4, hidden_size=32)
    trace = build_trace(request, device="cpu")
    calls = _passes(monkeypatch)
    build_walkthrough(request, 1, trace, device="cpu")
    loaded = CorpusModel.from_request(request).load("cpu")
    ids = torch.tensor(trace.token_ids)[None]
    loaded.forward(ids, torch.zeros_like(ids), torch.ones_like(ids))
    assert [c["gate"]["running"] for c in calls] == [1, 1]
    assert calls[0]["after"] == 1  # the walk held its turn around the pass
