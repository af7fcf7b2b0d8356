"""Precision as a setting: AE_DTYPE and --dtype, auto's rule, and a bfloat16 model whose attention weights are
softmaxed and kept in float32 (within 2e-2 of float32's) and whose circuit keeps float32's top edges."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import build_tiny_decoder

from model_core.models.loading import load_pretrained_uncached, model_dtype
from model_core.settings import Settings, load_settings

CPU, CUDA = torch.device("cpu"), torch.device("cuda")  # a device object needs no GPU


def test_ae_dtype_is_read_and_checked():
    assert load_settings({}).dtype == "auto"
    assert load_settings({"AE_DTYPE": " BFloat16 "}).dtype == "bfloat16"
    with pytest.raises(ValueError, match="AE_DTYPE='float8'"):
        load_settings({"AE_DTYPE": "float8"})


@pytest.mark.parametrize("preference, n, device, expected", [
    ("auto", 8_000_000_000, CPU, torch.float32),  # a CPU: always float32
    ("auto", 1_500_000_000, CUDA, torch.bfloat16),  # a GPU, over 1B
    ("auto", 135_000_000, CUDA, torch.float32),  # a GPU, under 1B
    ("float16", 135_000_000, CPU, torch.float16),  # asked for: as asked
    ("float32", 8_000_000_000, CUDA, torch.float32),
])
def test_auto_is_float32_on_a_cpu_and_bfloat16_on_a_gpu_over_one_billion(preference, n, device, expected):
    assert model_dtype(preference, n, device) == expected


def test_the_command_line_takes_dtype_on_every_verb_that_loads_a_model(monkeypatch):
    import os

    from model_core.cli._common import apply_dtype
    from model_core.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, type(parser._subparsers._group_actions[0])))
    verbs = [name for name, p in sub.choices.items() if "--device" in p._option_string_actions]
    assert {"circuit", "export", "patch", "qk"} <= set(verbs)
    assert all("--dtype" in sub.choices[name]._option_string_actions for name in verbs)
    monkeypatch.setenv("AE_DTYPE", "auto")  # restored (deleted) after the test: apply_dtype sets it
    args = parser.parse_args(["circuit", "--model", "pretrained", "--dataset", "ioi:4:0", "--dtype", "bfloat16"])
    apply_dtype(args)
    assert os.environ["AE_DTYPE"] == "bfloat16" and load_settings().dtype == "bfloat16"
    with pytest.raises(SystemExit):
        parser.parse_args(["circuit", "--model", "pretrained", "--dtype", "float8"])


# -- a tiny model in bfloat16 on the CPU ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    """The tiny Llama loaded in float32 and in bfloat16."""
    folder = build_tiny_decoder("llama", tmp_path_factory.mktemp("dtype") / "llama")
    return (load_pretrained_uncached(str(folder), device="cpu", settings=Settings(dtype="float32")),
            load_pretrained_uncached(str(folder), device="cpu", settings=Settings(dtype="bfloat16")))


TEXT = "The cat sat on the mat and watched the flies near the window. The dog slept by the door."


def _trace(loaded):
    from model_core.trace.forward import trace_pretrained

    return trace_pretrained(loaded, loaded.family.encode(loaded.tokenizer, TEXT, max_tokens=128))


def test_a_bfloat16_models_weights_are_float32_and_within_2e_2_of_float32s(tiny_pair):
    full, half = tiny_pair
    assert half.dtype == torch.bfloat16 and full.dtype == torch.float32
    reference, got = _trace(full), _trace(half)
    assert (reference.dtype, got.dtype) == ("float32", "bfloat16")
    assert got.weights.dtype == np.float32
    np.testing.assert_allclose(got.weights.sum(-1), 1.0, atol=1e-5)  # softmaxed in float32: rows sum to 1
    gap = np.abs(got.weights - reference.weights)  # (layer, head, q_pos, k_pos)
    assert gap.max() > 1e-4  # bfloat16 did change the numbers, so the comparisons below can fail
    # The first layer reads the embeddings alone: only q and k are rounded, and the scores and the softmax are
    # float32's, so every weight is within the issue's 2e-2.
    assert gap[0].max() <= 2e-2, gap[0].max()
    # Later layers read a bfloat16 residual stream, which no float32 softmax undoes: 99 weights in 100 are within
    # 2e-2, the largest within 5e-2 (measured on SmolLM2-135M, 21 tokens: largest 0.046, 99.9th percentile 0.013;
    # this tiny model's q and k are sharpened, so its scores are large: largest 0.033).
    assert np.percentile(gap, 99) <= 2e-2 and gap.max() <= 5e-2, (np.percentile(gap, 99), gap.max())


def test_a_bfloat16_pattern_hook_sees_float32(tiny_pair):
    from model_core.families.hooked import run_with_hooks

    _, half = tiny_pair
    ids = half.family.encode(half.tokenizer, TEXT, max_tokens=128).input_ids
    out = run_with_hooks(half.model, ids, names=["blocks.1.attn.hook_pattern", "blocks.1.attn.hook_z"])
    assert out.cache["blocks.1.attn.hook_pattern"].dtype == torch.float32
    assert out.cache["blocks.1.attn.hook_z"].dtype == torch.bfloat16  # the rest of the pass stays in bfloat16


def test_a_bfloat16_circuit_keeps_float32s_top_50_edges(tiny_pair):
    """EAP-IG on the tiny Llama (110 edges) in both precisions: the top 50 by |score| overlap by at least 45."""
    from model_core.circuits.datasets import Dataset, Pair
    from model_core.circuits.eap import circuit_model
    from model_core.circuits.run import run_circuit

    pairs = [Pair("The cat sat on the mat and the", "The bank sat on the mat and the", " cat", " bank"),
             Pair("The banana sat on the mat and the", "The flies sat on the mat and the", " banana", " flies"),
             Pair("The bank sat on the mat and the", "The cat sat on the mat and the", " bank", " cat")]
    results = [run_circuit(circuit_model(m.model, m.tokenizer), Dataset.of(pairs), method="eap-ig", steps=3,
                           curve=False) for m in tiny_pair]
    assert results[0].scores.graph.n_edges == 110  # a random 50 of them would share about 23 with another 50
    top = [r.scores.circuit_of_size(50) for r in results]
    overlap = int((top[0] & top[1]).sum())
    assert overlap >= 45, overlap
