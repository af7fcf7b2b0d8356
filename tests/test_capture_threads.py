"""Sessions share one cached model: passes run side by side in threads record only their own tensors."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from model_core import TraceRequest, build_trace

TEXTS = ["time flies like an arrow", "fruit flies like a banana, and so do the bees in the garden",
         "a river", "the old tree near the river and the children who play there every day"]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_concurrent_traces_of_one_model_equal_their_sequential_traces(tiny_decoders, family, monkeypatch):
    monkeypatch.setenv("AE_MAX_RUNS", "6")  # the gate lets the six passes run side by side, as on a GPU server
    requests = [TraceRequest("pretrained", t, model_id=str(tiny_decoders[family]),
                             head_mask=((True, False, True, True), (True,) * 4) if i % 2 else None)
                for i, t in enumerate(TEXTS * 3)]
    alone = [build_trace(r, device="cpu") for r in requests[:4]]
    with ThreadPoolExecutor(max_workers=6) as pool:
        together = list(pool.map(lambda r: build_trace(r, device="cpu"), requests))
    # Threads running side by side split BLAS work differently, so sums round differently (~1e-6);
    # a tensor from another session would differ by whole units, or in shape.
    for i, trace in enumerate(together):
        ref = alone[i % 4]
        assert trace.tokens == ref.tokens
        np.testing.assert_allclose(trace.weights, ref.weights, atol=1e-4)
        np.testing.assert_allclose(trace.hidden_states, ref.hidden_states, atol=1e-4)
        np.testing.assert_allclose(trace.queries, ref.queries, atol=1e-4)
