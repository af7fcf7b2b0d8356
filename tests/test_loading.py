"""Model sources, devices and load failures: one clear message each, never trust_remote_code."""

import json

import pytest
import torch

from model_core.models.loading import ModelLoadError, load_pretrained, resolve_model_source, select_device
from model_core.settings import BUNDLED_MODEL_ID, Settings


def test_auto_device_is_cpu_without_gpu():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert select_device("auto").type in (expected, "mps")


def test_unknown_device_is_refused():
    with pytest.raises(ValueError, match="Unknown device"):
        select_device("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_preference_without_gpu_says_so():
    with pytest.raises(ValueError, match="no CUDA GPU"):
        select_device("cuda")


def test_bundled_model_loads_offline_in_eval_mode_with_eager_attention(bundled):
    assert bundled.source.model_id == BUNDLED_MODEL_ID
    assert not bundled.model.training
    # loaded eager, then switched to the capturing function that runs the model's own eager attention
    assert bundled.model.config._attn_implementation == "attention_explorer"
    assert not any(p.requires_grad for p in bundled.model.parameters())
    assert bundled.model.config.model_type == "bert"


def test_load_is_cached(bundled):
    first = load_pretrained(None, device="cpu")  # the session fixture may have gone: other tests load models
    assert load_pretrained(None, device="cpu") is first


def test_folder_loads_as_model(tmp_path, tiny_bert):
    from model_core.models.loading import load_tokenizer

    tiny_bert.save_pretrained(tmp_path)
    load_tokenizer().save_pretrained(tmp_path)
    loaded = load_pretrained(str(tmp_path), device="cpu")
    assert loaded.model.config.hidden_size == 32 and loaded.source.kind == "folder"


def test_misspelled_or_uncached_id_fails_fast_with_advice(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="not in the local cache.*spelling"):
        load_pretrained("bert-base-uncasd", device="cpu")


def test_unsupported_family_is_refused_before_the_weights(tmp_path):
    from transformers import T5Config

    T5Config(num_hidden_layers=1, num_attention_heads=2, d_model=8, d_kv=4, d_ff=8).save_pretrained(tmp_path)  # a config, no weights
    with pytest.raises(ModelLoadError, match="'t5' model, which Attention Explorer does not support"):
        load_pretrained(str(tmp_path), device="cpu")


def test_model_over_the_parameter_limit_is_refused_before_the_weights(tmp_path, monkeypatch):
    from transformers import GPT2Config

    GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=1000, n_positions=64).save_pretrained(tmp_path)
    monkeypatch.setenv("AE_MAX_PARAMS", "10000")
    with pytest.raises(ModelLoadError, match=r"has 0 M parameters; this deployment loads at most 0 M \(AE_MAX_PARAMS\)"):
        load_pretrained(str(tmp_path), device="cpu")


def test_folder_that_is_not_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_pretrained(str(tmp_path), device="cpu")


def test_remote_code_config_is_not_executed(tmp_path):
    cfg = {"model_type": "evil", "auto_map": {"AutoConfig": "evil.EvilConfig"}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "evil.py").write_text("raise SystemExit('remote code ran')\n")
    with pytest.raises(ModelLoadError):
        load_pretrained(str(tmp_path), device="cpu")


@pytest.mark.parametrize("bad", ["../etc", "models/../../x", "a b c", "<script>", "x" * 300])
def test_bad_ids_are_refused(bad):
    with pytest.raises(ModelLoadError):
        resolve_model_source(bad, Settings())


def test_local_folders_can_be_switched_off(tmp_path):
    with pytest.raises(ModelLoadError, match="switched off"):
        resolve_model_source(str(tmp_path), Settings(allow_local_models=False))


def test_allowlist(tmp_path):
    s = Settings(allowed_models=("bert-base-uncased",))
    assert resolve_model_source("bert-base-uncased", s).kind == "hub"
    assert resolve_model_source(BUNDLED_MODEL_ID, s).kind == "bundled"
    with pytest.raises(ModelLoadError, match="not allowed"):
        resolve_model_source("roberta-base", s)


def test_the_deployments_own_default_folder_loads_with_local_folders_off(tmp_path, tiny_bert):
    """An image built with PRELOAD_MODEL=docker/models/X runs with that folder as default and folders off."""
    from model_core.models.loading import resolve_model_source
    from model_core.settings import Settings

    tiny_bert.save_pretrained(tmp_path / "baked")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text("{}")
    settings = Settings(default_model=str(tmp_path / "baked"), allow_local_models=False)
    assert resolve_model_source(None, settings).kind == "folder"
    with pytest.raises(ModelLoadError, match="switched off"):
        resolve_model_source(str(tmp_path / "other"), settings)


def test_models_loaded_from_several_threads_at_once_all_load_and_later_loads_still_work(tiny_decoders):
    """Two sessions loading models at the same moment once left transformers' meta-device patches in place, and every
    later load in the process failed ("Cannot copy out of meta tensor"); loads now take turns (``LOADING``)."""
    from concurrent.futures import ThreadPoolExecutor

    from model_core.models.loading import load_pretrained_uncached

    folders = [str(tiny_decoders[family]) for family in ("llama", "gpt2")] * 3
    for _ in range(3):
        with ThreadPoolExecutor(max_workers=len(folders)) as pool:
            loaded = list(pool.map(lambda folder: load_pretrained_uncached(folder, device="cpu"), folders))
        assert all(not p.is_meta for m in loaded for p in m.model.parameters())
    after = load_pretrained_uncached(folders[0], device="cpu")
    assert not any(p.is_meta for p in after.model.parameters())
