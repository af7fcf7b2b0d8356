"""ui.trace_cache: the one per-trace cache of derived results, for full and compact traces alike, bounded by bytes."""

from __future__ import annotations

import numpy as np
import pytest

from synthetic import synthetic_trace
from ui import trace_cache
from ui.trace_cache import DERIVED, per_trace, result_nbytes, trace_key

CALLS: list[tuple] = []


@per_trace()
def _row_sums(trace, layer: int) -> np.ndarray:
    CALLS.append((id(trace), layer))
    return trace.weights[layer].sum(-1)


@per_trace()
def _big(trace, tag: int) -> np.ndarray:
    return np.full(1_000_000, tag, dtype=np.uint8)  # 1 MB


@pytest.fixture(autouse=True)
def _fresh():
    DERIVED.clear()
    CALLS.clear()
    yield
    DERIVED.clear()


def test_a_result_is_computed_once_per_trace_and_arguments_and_shared_by_equal_traces():
    trace = synthetic_trace(20, 2, 3, seed=1)
    first = _row_sums(trace, 0)
    assert _row_sums(trace, 0) is first and len(CALLS) == 1
    _row_sums(trace, 1)
    assert len(CALLS) == 2  # the arguments are part of the key
    twin = type(trace)(**trace.__dict__)  # another object with the same content: the same results
    assert _row_sums(twin, 0) is first and len(CALLS) == 2


def test_cached_says_whether_a_result_is_there_without_computing_it():
    trace = synthetic_trace(12, 1, 2, seed=2)
    assert not _row_sums.cached(trace, 0) and not CALLS
    _row_sums(trace, 0)
    assert _row_sums.cached(trace, 0) and not _row_sums.cached(trace, 1)


def test_the_results_are_bounded_by_bytes_least_recently_used_out_first(monkeypatch):
    monkeypatch.setattr(trace_cache, "derived_budget", lambda: 2.5e6)
    trace = synthetic_trace(12, 1, 2, seed=3)
    a = _big(trace, 1)
    _big(trace, 2)
    assert _big(trace, 1) is a  # a hit, and now the most recent
    _big(trace, 3)  # 3 MB > 2.5 MB: tag 2, the least recently used, goes
    assert _big.cached(trace, 1) and not _big.cached(trace, 2) and _big.cached(trace, 3)
    assert DERIVED.nbytes == 2_000_000


def test_a_compact_traces_results_are_cached_by_its_own_key(tiny_decoders):
    from model_core import TraceRequest
    from model_core.compact.build import build_compact

    request = TraceRequest("pretrained", "The river rose in the night. The valley waited.",
                           model_id=str(tiny_decoders["llama"]))
    compact = build_compact(request, device="cpu")
    assert trace_key(compact).startswith("compact|") and trace_key(compact) != trace_key(synthetic_trace(8, 1, 1))

    @per_trace()
    def first_share(trace, layer: int, head: int) -> np.ndarray:
        CALLS.append(layer)
        return trace.weights(layer, head, cols=slice(0, 1))[:, 0]

    share = first_share(compact, 1, 0)
    assert first_share(compact, 1, 0) is share and CALLS == [1]


def test_result_bytes_count_arrays_inside_containers_and_dataclasses():
    from model_core.analysis import head_stats

    trace = synthetic_trace(10, 2, 2, seed=4)
    stats = head_stats(trace)
    assert result_nbytes(stats) == sum(g.nbytes for g in stats.to_dict().values())
    assert result_nbytes((np.zeros(10, np.float32), {"a": np.zeros(3, np.int64)}, b"xyz")) == 40 + 24 + 3


def test_a_trace_freed_while_its_thread_holds_the_caches_lock_does_not_deadlock():
    """A trace's finalizer runs in whichever thread frees it (here: a garbage collection under the cache's own lock,
    as an allocation inside ``DERIVED`` could start); it must take no lock, and the results go at the next call."""
    import gc
    import threading

    trace = synthetic_trace(12, 2, 2, seed=3)
    _row_sums(trace, 0)
    key = trace_cache.cached_key(trace)
    cycle = [trace]
    cycle.append(cycle)  # freed only by a garbage collection
    del trace
    done = threading.Event()

    def collect_under_the_lock():
        with DERIVED._lock, trace_cache._KEYS_LOCK:
            gc.collect()
        done.set()

    del cycle
    worker = threading.Thread(target=collect_under_the_lock, daemon=True)
    worker.start()
    assert done.wait(10), "the finalizer deadlocked on a lock its own thread held"
    other = synthetic_trace(9, 2, 2, seed=4)  # another text: another key
    _row_sums(other, 0)  # the next call forgets the freed trace and drops its results
    assert key not in trace_cache._KEYS.values()
    assert DERIVED.entries_of(key) == 0
