"""On a CUDA GPU: the device is picked by itself, models live there, and traces match the CPU's."""

import numpy as np
import pytest

from model_core import DEFAULT_TEXT_A, DEFAULT_TEXT_B, TraceRequest, build_trace
from model_core.models.loading import load_pretrained, select_device

pytestmark = pytest.mark.cuda


def test_auto_picks_cuda():
    assert select_device("auto").type == "cuda"


def test_bert_runs_on_cuda_and_matches_cpu():
    loaded = load_pretrained(None, device="cuda")
    assert next(loaded.model.parameters()).is_cuda
    gpu = build_trace(TraceRequest("bert", DEFAULT_TEXT_A, DEFAULT_TEXT_B), device="cuda")
    cpu = build_trace(TraceRequest("bert", DEFAULT_TEXT_A, DEFAULT_TEXT_B), device="cpu")
    np.testing.assert_allclose(gpu.weights, cpu.weights, atol=1e-4)
    np.testing.assert_allclose(gpu.hidden_states, cpu.hidden_states, atol=1e-3)


def test_custom_encoder_on_cuda_matches_cpu_at_512_tokens():
    text = "word " * 510
    gpu = build_trace(TraceRequest("custom", text, causal=True), device="cuda")
    cpu = build_trace(TraceRequest("custom", text, causal=True), device="cpu")
    assert gpu.n_tokens == 512
    np.testing.assert_allclose(gpu.weights, cpu.weights, atol=1e-4)
