"""ui.derived: results derived from a trace, in the one per-trace cache (ui.trace_cache), shared and read-only."""

import numpy as np

from model_core.analysis import head_stats as compute_head_stats
from model_core.words import word_spans
from synthetic import synthetic_trace
from ui import derived, trace_cache
from attention_explorer.figures import head_mosaic


def test_each_derived_result_is_computed_once_per_trace_and_functions_do_not_collide():
    trace = synthetic_trace(40, 2, 3, seed=1)
    stats = derived.cached_head_stats(trace)
    assert derived.cached_head_stats(trace) is stats
    # Keyed by the trace's content: another trace (here with a head switched off) has its own.
    other = type(trace)(**{**trace.__dict__, "head_mask": np.array([[True, False, True], [True, True, True]])})
    assert derived.cached_head_stats(other) is not stats
    mosaic = derived.overview_mosaic_cells(trace, False, 32)
    assert isinstance(mosaic, np.ndarray) and derived.overview_mosaic_cells(trace, False, 32) is mosaic
    assert derived.overview_mosaic_cells(trace, False, 8) is not mosaic  # the arguments are part of the key


def test_derived_results_equal_the_model_core_functions_and_are_read_only():
    trace = synthetic_trace(tokens=("[CLS]", "em", "##bed", "##ding", "##s", "rock", "[SEP]"), n_layers=2,
                            n_heads=2, seed=3)
    stats, expected = derived.cached_head_stats(trace), compute_head_stats(trace)
    for name, grid in stats.to_dict().items():
        np.testing.assert_array_equal(grid, expected.to_dict()[name])
        assert not grid.flags.writeable
    merged = derived.word_attentions(trace)
    np.testing.assert_array_equal(merged, word_spans(trace.tokens).merge(trace.weights))
    assert not merged.flags.writeable and merged.shape[-1] == 4  # [CLS] embeddings rock [SEP]
    np.testing.assert_array_equal(derived.overview_mosaic_cells(trace, True, 32), head_mosaic(merged, 32))


def test_derived_results_go_with_their_trace():
    """Nothing derived keeps a trace alive, and what was derived from a trace is freed with it."""
    import gc
    import weakref

    from harness.waits import wait_until

    trace = synthetic_trace(30, 2, 3, seed=4)
    results = [derived.cached_head_stats(trace), derived.word_attentions(trace),
               derived.overview_mosaic_cells(trace, False, 16), derived.rollout_and_flow(trace)]
    gone = weakref.ref(trace)
    kept = weakref.ref(results[1])
    key = trace_cache.cached_key(trace)
    assert trace_cache.DERIVED.entries_of(key) == 4
    del trace, results
    gc.collect()
    assert gone() is None
    # The freed trace's results are dropped by a thread of their own (ui.trace_cache._forget).
    wait_until(lambda: trace_cache.DERIVED.entries_of(key) == 0, 10, "the freed trace's results dropped")
    gc.collect()
    assert kept() is None
    assert trace_cache.DERIVED.entries_of(key) == 0
