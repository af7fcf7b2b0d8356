"""The command line with decoders: `models` lists the bundled ids and families; `export` and `corpus` take
`--model pretrained` for every family (and the old `--model bert`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from model_core.__main__ import main


def test_models_json_lists_the_bundled_ids_and_every_family(capsys):
    assert main(["models", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    ids = {m["id"]: m["family"] for m in listing["bundled"]}
    assert ids == {"bundled:all-MiniLM-L6-v2": "bert", "bundled:SmolLM2-135M-Instruct": "llama"}
    families = {f["name"]: f for f in listing["families"]}
    assert set(families) == {"custom", "bert", "gpt2", "llama"}
    assert families["llama"]["decoder"] and not families["bert"]["decoder"]
    assert {"llama", "qwen2", "mistral", "gemma", "phi3"} <= set(families["llama"]["model_types"])


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma"])
def test_export_pretrained_decoder_writes_predictions_and_kv_heads(tmp_path, tiny_decoders, family, capsys):
    out = tmp_path / "trace.npz"
    assert main(["export", "--model", "pretrained", "--model-id", str(tiny_decoders[family]), "--text",
                 "time flies like an arrow", "--text-b", "fruit flies like a banana", "--words", "--device", "cpu",
                 "--out", str(out)]) == 0
    data = np.load(out)
    n = len(data["tokens"])
    assert data["attentions"].shape[2:] == (n, n)
    assert np.all(np.triu(data["attentions"], 1) == 0)  # causal
    assert data["next_token_ids"].shape == (n, 10) and np.all(np.diff(data["next_token_probs"], axis=1) <= 0)
    assert data["kv_heads"].shape == (data["attentions"].shape[1],)
    assert data["word_attentions"].shape[2] == len(data["words"]) <= n


def test_export_keeps_the_old_model_bert(tmp_path, capsys):
    out = tmp_path / "trace.json"
    assert main(["export", "--model", "bert", "--text", "time flies", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["tokens"][0] == "[CLS]"


def test_export_refuses_custom_options_for_a_pretrained_model(tmp_path, capsys):
    assert main(["export", "--model", "pretrained", "--causal", "--text", "hi", "--out", str(tmp_path / "t.npz")]) == 2
    assert "--model custom only" in capsys.readouterr().err


def test_export_of_an_unsupported_family_is_one_line(tmp_path, capsys):
    from transformers import T5Config

    T5Config(num_hidden_layers=1, num_attention_heads=2, d_model=8, d_kv=4, d_ff=8).save_pretrained(tmp_path / "t5")
    assert main(["export", "--model", "pretrained", "--model-id", str(tmp_path / "t5"), "--text", "hi",
                 "--out", str(tmp_path / "t.npz")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "does not support" in err and err.count("\n") == 1


@pytest.mark.slow
def test_corpus_cli_runs_a_decoder(tmp_path, tiny_decoders):
    code = main(["corpus", "--input", "demo", "--model", "pretrained", "--model-id", str(tiny_decoders["llama"]),
                 "--limit", "30", "--qk", "--quiet", "--out", str(tmp_path / "run")])
    assert code == 0
    from model_core.corpus import open_run

    run = open_run(tmp_path / "run")
    assert run.shape == (2, 4) and run.complete
    assert run.manifest["model"] == {"kind": "pretrained", "model_id": str(tiny_decoders["llama"])}


def test_a_text_longer_than_the_decoders_positions_says_the_limit(tiny_decoders):
    from model_core import InputError, TraceRequest, build_trace

    with pytest.raises(InputError, match=r"the limit is 128 \(the model's position table\)"):
        build_trace(TraceRequest("pretrained", "word " * 300, model_id=str(tiny_decoders["gpt2"])), device="cpu")
    with pytest.raises(InputError, match="The text is empty"):
        build_trace(TraceRequest("pretrained", "  \u200b ", model_id=str(tiny_decoders["gpt2"])), device="cpu")
    cut = build_trace(TraceRequest("pretrained", "word " * 300, model_id=str(tiny_decoders["gpt2"]), truncate=True),
                      device="cpu")
    assert cut.n_tokens == 128
