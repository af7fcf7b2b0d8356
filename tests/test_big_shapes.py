"""Models of billions of parameters, from configs of real shapes (no download, no weights): their sizes counted on
the meta device, AE_MAX_PARAMS=auto on a CPU and on a GPU (its memory query patched), and a model too big for the
device refused before any weight is read, with its size and the device's memory in the message. Building and
tracing a 1.5B-shaped model is a bench (bench/bench_gpu.py --shape qwen2.5-1.5b), not a test: 6 GB in float32."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from harness.shapes import SHAPES  # the published configs' shape fields
from model_core.families import family_of_type
from model_core.models import loading
from model_core.models.errors import ModelLoadError
from model_core.models.loading import check_size, count_parameters, max_params
from model_core.settings import Settings

PARAMS = {"smollm2": 134_515_008, "llama-3.2-1b": 1_235_814_400, "qwen2.5-1.5b": 1_543_714_304, "llama-3.1-8b": 8_030_261_248}
"""Their parameter counts as published (the model cards' 1.24B, 1.54B, 8.03B; SmolLM2's is the bundled checkpoint's
own count, 135M on its card)."""
GB = 2**30
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def _config(shape: str):
    fields = dict(SHAPES[shape])
    return transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_real_shape_counts_its_published_parameters(shape):
    config = _config(shape)
    assert count_parameters(config, family_of_type(config.model_type)) == PARAMS[shape]


def _gpu(monkeypatch, gb: float) -> None:
    """Pretend the CUDA GPU has ``gb`` GiB (the query the limit reads; nothing else touches CUDA here)."""
    real = loading.device_memory_bytes
    monkeypatch.setattr(loading, "device_memory_bytes",
                        lambda device: int(gb * GB) if torch.device(device).type == "cuda" else real(device))


def test_auto_on_a_cpu_is_1_5_billion():
    assert max_params(Settings(), CPU) == 1_500_000_000
    assert check_size(PARAMS["llama-3.2-1b"], "llama-3.2-1b", Settings(), CPU) == torch.float32
    with pytest.raises(ModelLoadError, match=r"has 1,544 M parameters; this deployment loads at most 1,500 M"):
        check_size(PARAMS["qwen2.5-1.5b"], "qwen2.5-1.5b", Settings(), CPU)  # 1.54B: over the CPU's 1.5B
    assert check_size(PARAMS["qwen2.5-1.5b"], "qwen2.5-1.5b", Settings(max_params=2_000_000_000), CPU) == torch.float32


def test_auto_on_a_gpu_follows_its_memory_at_the_chosen_precision(monkeypatch):
    _gpu(monkeypatch, 24)
    # bfloat16 (auto over 1B): 3/4 of 24 GiB at 2 bytes a parameter
    assert max_params(Settings(), CUDA) == int(0.75 * 24 * GB / 2)
    assert max_params(Settings(dtype="float32"), CUDA) == int(0.75 * 24 * GB / 4)
    assert check_size(PARAMS["llama-3.1-8b"], "llama-3.1-8b", Settings(), CUDA) == torch.bfloat16  # 15 GB of 18
    with pytest.raises(ModelLoadError, match=r"Its weights take 29.9 GB in float32, and this GPU has 24.0 GB"):
        check_size(PARAMS["llama-3.1-8b"], "llama-3.1-8b", Settings(dtype="float32"), CUDA)


def test_a_model_over_an_explicit_limit_that_does_not_fit_the_gpu_is_refused(monkeypatch):
    """AE_MAX_PARAMS set high does not let an 8B model in bfloat16 (15 GB) onto a 16 GiB GPU (12 GB for weights)."""
    _gpu(monkeypatch, 16)
    with pytest.raises(ModelLoadError, match=r"8,030 M parameters.*\(AE_MAX_PARAMS\).*15.0 GB in bfloat16, and this "
                                             r"GPU has 16.0 GB"):
        check_size(PARAMS["llama-3.1-8b"], "llama-3.1-8b", Settings(max_params=100_000_000_000), CUDA)


@pytest.mark.parametrize("where", ["cpu", "gpu"])  # not "cuda": conftest skips a test with that keyword off a GPU
def test_a_model_too_big_for_the_device_is_refused_before_its_weights_are_read(tmp_path, monkeypatch, where):
    """A folder with an 8B config and no weights: the refusal comes from the config (were the weights read, the error
    would be that they are missing). On a 16 GiB GPU, and on the CPU (auto: 1.5B)."""
    _gpu(monkeypatch, 16)
    device = "cuda" if where == "gpu" else "cpu"
    (tmp_path / "config.json").write_text(json.dumps({**SHAPES["llama-3.1-8b"], "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ModelLoadError, match=r"has 8,030 M parameters; this deployment loads at most .* GB") as err:
        loading.load_pretrained_uncached(str(tmp_path), device=torch.device(device), settings=Settings())
    assert ("this GPU has 16.0 GB" in str(err.value)) == (device == "cuda")
