"""A generated sequence as the app's trace: the request carries its ids and the reply's start; its trace equals eager
``output_attentions`` of the whole sequence; reply_start survives saving, exporting and the command line."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from model_core import TraceRequest, build_trace
from model_core.generate.generation import DecodingOptions, generate
from model_core.models.loading import load_pretrained

PROMPT = "time flies like an arrow"
NEW = 8


def _generation(folder):
    return generate(load_pretrained(str(folder), device="cpu"), PROMPT, options=DecodingOptions(max_new_tokens=NEW))


def _eager_attentions(folder, ids: list[int]) -> np.ndarray:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_attentions=True)
    return torch.stack([a[0] for a in out.attentions]).numpy()  # (layer, head, q_pos, k_pos)


@pytest.mark.parametrize("family", ["gpt2", "llama", "qwen2"])
def test_the_replys_trace_equals_eager_attention_of_the_whole_sequence(tiny_decoders, family):
    folder = tiny_decoders[family]
    result = _generation(folder)
    trace = build_trace(result.request(str(folder)), device="cpu")
    assert trace.token_ids.tolist() == result.token_ids.tolist()
    assert trace.reply_start == result.reply_start == len(result.prompt_ids)
    np.testing.assert_allclose(trace.weights, _eager_attentions(folder, result.token_ids.tolist()), atol=1e-5)


def test_the_trace_reads_the_generated_ids_even_where_the_text_retokenises_otherwise(tiny_decoders):
    folder = str(tiny_decoders["gpt2"])
    tok = load_pretrained(folder, device="cpu").tokenizer
    ids = tok.convert_tokens_to_ids(["t", "i", "m", "e", "Ġflies"])  # not how "time flies" is tokenised
    text = tok.decode(ids, skip_special_tokens=False)
    assert tok(text)["input_ids"] != ids
    trace = build_trace(TraceRequest("pretrained", text, model_id=folder, token_ids=ids, reply_start=4), device="cpu")
    assert trace.token_ids.tolist() == ids and trace.reply_start == 4
    np.testing.assert_allclose(trace.weights, _eager_attentions(folder, ids), atol=1e-5)


def test_an_edited_text_is_tokenised_as_typed_and_has_no_reply(tiny_decoders):
    folder = str(tiny_decoders["llama"])
    result = _generation(folder)
    request = dataclasses.replace(result.request(folder), text_a=result.text + " and more")
    trace = build_trace(request, device="cpu")
    assert trace.reply_start is None
    assert trace.tokens == build_trace(TraceRequest("pretrained", request.text_a, model_id=folder), device="cpu").tokens


def test_a_links_ids_and_reply_start_parse_and_are_checked():
    request = TraceRequest("pretrained", "x", token_ids="5, 6,7", reply_start="2")
    assert request.token_ids == (5, 6, 7) and request.reply_start == 2
    assert request == TraceRequest("pretrained", "x", token_ids=(5, 6, 7), reply_start=2)
    with pytest.raises(ValueError, match="reply_start 3 is outside"):
        TraceRequest("pretrained", "x", token_ids=(5, 6, 7), reply_start=3)
    with pytest.raises(ValueError, match="comma-separated"):
        TraceRequest("pretrained", "x", token_ids="5,a")
    assert TraceRequest("pretrained", "x", "a pair", token_ids=(5, 6), reply_start=1).token_ids is None
    assert TraceRequest("custom", "x", token_ids=(5, 6), reply_start=1).reply_start is None


def test_reply_start_survives_save_and_load_and_old_files_still_load(tiny_decoders, tmp_path):
    from attention_explorer.saved import load_trace, save_trace

    folder = str(tiny_decoders["llama"])
    trace = build_trace(_generation(folder).request(folder), device="cpu")
    assert load_trace(save_trace(trace, tmp_path / "t.npz")).reply_start == trace.reply_start
    typed = build_trace(TraceRequest("pretrained", PROMPT, model_id=folder), device="cpu")
    loaded = load_trace(save_trace(typed, tmp_path / "typed.npz"))
    assert loaded.reply_start is None
    # A file saved before reply_start existed has no such entry in its metadata.
    with np.load(tmp_path / "typed.npz") as archive:
        arrays = {name: archive[name] for name in archive.files}
    meta = json.loads(str(arrays["_meta"]))
    meta.pop("reply_start")
    np.savez_compressed(tmp_path / "old.npz", **{**arrays, "_meta": np.array(json.dumps(meta))})
    assert load_trace(tmp_path / "old.npz").reply_start is None


def test_the_export_carries_reply_start_only_for_a_reply(tiny_decoders, tmp_path):
    from model_core.io.export import write_trace

    folder = str(tiny_decoders["qwen2"])
    result = _generation(folder)
    trace = build_trace(result.request(folder), device="cpu")
    with np.load(write_trace(trace, tmp_path / "t.npz")) as data:
        assert int(data["reply_start"]) == result.reply_start
    assert json.loads(write_trace(trace, tmp_path / "t.json").read_text())["reply_start"] == result.reply_start
    typed = build_trace(TraceRequest("pretrained", PROMPT, model_id=folder), device="cpu")
    with np.load(write_trace(typed, tmp_path / "typed.npz")) as data:
        assert "reply_start" not in data.files


def test_a_compact_trace_keeps_reply_start_through_save_and_load(tiny_decoders, tmp_path):
    from model_core.compact.build import build_compact
    from model_core.compact.trace import load_compact

    folder = str(tiny_decoders["llama"])
    compact = build_compact(TraceRequest("pretrained", PROMPT, model_id=folder), device="cpu")
    marked = dataclasses.replace(compact, reply_start=4)
    assert load_compact(marked.save(tmp_path / "c.npz")).reply_start == 4
    assert load_compact(compact.save(tmp_path / "plain.npz")).reply_start is None


def test_the_command_line_prints_the_new_tokens_and_writes_the_whole_sequence(tiny_decoders, tmp_path, capsys):
    from model_core.cli.main import main

    folder = str(tiny_decoders["llama"])
    expected = _generation(folder)
    out = tmp_path / "gen.npz"
    code = main(["generate", "--model", "pretrained", "--model-id", folder, "--prompt", PROMPT,
                 "--max-new-tokens", str(NEW), "--json", "--out", str(out)])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {"prompt_tokens": len(expected.prompt_ids), "token_ids": expected.new_ids.tolist(),
                       "tokens": list(expected.tokens), "text": expected.reply}
    with np.load(out) as data:
        assert int(data["reply_start"]) == len(expected.prompt_ids)
        assert data["attentions"].shape[-1] == len(expected.token_ids)


@pytest.mark.parametrize("argv, message", [
    (["--sample", "--temperature", "0"], "temperature must be above 0"),
    (["--sample", "--top-p", "1.5"], "top_p"),
    (["--max-new-tokens", "0"], "max_new_tokens"),
    (["--chat"], "no chat template"),
])
def test_the_command_line_refuses_bad_settings_with_a_message(tiny_decoders, capsys, argv, message):
    from model_core.cli.main import main

    code = main(["generate", "--model", "pretrained", "--model-id", str(tiny_decoders["gpt2"]), "--prompt", PROMPT,
                 *argv])
    assert code == 1 and message in capsys.readouterr().err
