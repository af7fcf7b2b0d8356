"""Generation through the one forward route (model_core.generate.generation): greedy equals transformers' generate,
with and without a chat template; end-of-sequence, sampling, stopping and room; the whole sequence's trace."""

from __future__ import annotations

import dataclasses
import json
import shutil
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

from model_core.generate.generation import (
    DecodingOptions,
    GenerationStream,
    assemble,
    choose_token,
    generate,
    prompt_ids,
)
from model_core.families.checks import NotADecoder
from model_core.models.loading import load_pretrained

PROMPT = "time flies like an arrow"
# A small chat template for the tiny tokenizer ("<|endoftext|>" is its one special token).
TEMPLATE = ("{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}<|endoftext|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}")
FAMILIES = ("gpt2", "llama", "qwen2")
NEW = 12


@pytest.fixture(scope="module")
def chat_decoders(tiny_decoders, tmp_path_factory) -> dict:
    """Copies of the tiny GPT-2, Llama and Qwen2 whose tokenizers have ``TEMPLATE``."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("chat-decoders")
    out = {}
    for family in FAMILIES:
        folder = Path(shutil.copytree(tiny_decoders[family], root / family))
        tok = AutoTokenizer.from_pretrained(folder)
        tok.chat_template = TEMPLATE
        tok.save_pretrained(folder)
        out[family] = folder
    return out


@cache
def _reference(folder: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()


def _reference_new_ids(folder, ids: list[int], new: int) -> list[int]:
    with torch.no_grad():
        out = _reference(str(folder)).generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
                                               max_new_tokens=new, do_sample=False)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_equals_transformers_generate(chat_decoders, family, chat):
    loaded = load_pretrained(str(chat_decoders[family]), device="cpu")
    result = generate(loaded, PROMPT, chat=chat, options=DecodingOptions(max_new_tokens=NEW))
    ids = prompt_ids(loaded.tokenizer, PROMPT, chat)
    assert result.prompt_ids.tolist() == ids
    assert result.new_ids.tolist() == _reference_new_ids(chat_decoders[family], ids, NEW)
    assert result.reply_start == len(ids) and result.reason in ("length", "eos")


def test_a_generation_is_timed_from_its_own_steps(chat_decoders):
    loaded = load_pretrained(str(chat_decoders["llama"]), device="cpu")
    now = [100.0]

    def clock() -> float:  # a fake clock: each reading is 0.01 s after the one before (a pass takes time)
        now[0] += 0.01
        return now[0]

    stream = GenerationStream(loaded.family, loaded.model, loaded.tokenizer, prompt_ids(loaded.tokenizer, PROMPT,
                              False), DecodingOptions(max_new_tokens=4), clock=clock)
    for step in stream:
        now[0] += 0.05  # a slow reader: its time between tokens counts
    result = stream.result()
    times = [step.seconds for step in stream.steps]
    assert times == pytest.approx([0.01, 0.07, 0.13, 0.19])  # one clock reading a step, and the reader's 0.05 s
    assert result.first_token_s == pytest.approx(0.01)  # the fake clock's first reading after the start
    assert result.tokens_per_s == pytest.approx(3 / 0.18)  # the reader's time is in it
    untimed = [dataclasses.replace(step, seconds=float("nan")) for step in stream.steps]
    bare = assemble(loaded.tokenizer, result.prompt_ids, untimed, "length")
    assert bare.first_token_s is None and bare.tokens_per_s is None
    one = assemble(loaded.tokenizer, result.prompt_ids, stream.steps[:1], "stopped")
    assert one.first_token_s == pytest.approx(0.01) and one.tokens_per_s is None


def test_the_chat_prompt_is_the_tokenizers_own_template(chat_decoders):
    tok = load_pretrained(str(chat_decoders["llama"]), device="cpu").tokenizer
    expected = tok.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                       tokenize=True, return_dict=True)["input_ids"]
    assert prompt_ids(tok, PROMPT, chat=True) == list(expected)
    assert prompt_ids(tok, PROMPT, chat=False) == tok(PROMPT)["input_ids"]


def test_chat_without_a_template_and_an_empty_prompt_say_what_to_do(tiny_decoders):
    tok = load_pretrained(str(tiny_decoders["gpt2"]), device="cpu").tokenizer
    with pytest.raises(ValueError, match="no chat template"):
        prompt_ids(tok, PROMPT, chat=True)
    with pytest.raises(ValueError, match="empty"):
        prompt_ids(tok, "  \n", chat=False)


def test_generation_stops_at_an_end_of_sequence_token_and_keeps_it(tiny_decoders, tmp_path):
    free = generate(load_pretrained(str(tiny_decoders["llama"]), device="cpu"), PROMPT,
                    options=DecodingOptions(max_new_tokens=NEW))
    eos = int(free.new_ids[3])  # make the fourth greedy token an end-of-sequence token
    first = int(np.flatnonzero(free.new_ids == eos)[0])
    folder = Path(shutil.copytree(tiny_decoders["llama"], tmp_path / "llama-eos"))
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": [0, eos]}))
    result = generate(load_pretrained(str(folder), device="cpu"), PROMPT, options=DecodingOptions(max_new_tokens=NEW))
    assert result.reason == "eos"
    assert result.new_ids.tolist() == free.new_ids[:first + 1].tolist()  # the eos token stays
    assert result.new_ids.tolist() == _reference_new_ids(folder, result.prompt_ids.tolist(), NEW)


def test_sampling_repeats_with_its_seed_and_changes_with_another(tiny_decoders):
    loaded = load_pretrained(str(tiny_decoders["qwen2"]), device="cpu")
    runs = [generate(loaded, PROMPT, options=DecodingOptions(max_new_tokens=NEW, sample=True, seed=seed)).new_ids
            for seed in (1, 1, 2)]
    assert runs[0].tolist() == runs[1].tolist()
    assert runs[0].tolist() != runs[2].tolist()


def test_sampling_with_a_tiny_top_p_or_temperature_is_greedy(tiny_decoders):
    loaded = load_pretrained(str(tiny_decoders["gpt2"]), device="cpu")
    greedy = generate(loaded, PROMPT, options=DecodingOptions(max_new_tokens=NEW)).new_ids.tolist()
    for options in (DecodingOptions(max_new_tokens=NEW, sample=True, top_p=1e-6, seed=3),
                    DecodingOptions(max_new_tokens=NEW, sample=True, temperature=1e-4, seed=3)):
        assert generate(loaded, PROMPT, options=options).new_ids.tolist() == greedy


def test_top_p_samples_only_the_smallest_set_that_reaches_it():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    generator = torch.Generator().manual_seed(0)
    drawn = {choose_token(logits, DecodingOptions(sample=True, top_p=0.8), generator) for _ in range(300)}
    assert drawn == {0, 1}  # 0.5 + 0.3 reaches 0.8: tokens 2 and 3 are never drawn


@pytest.mark.parametrize("bad, message", [
    (dict(temperature=0.0), "temperature must be above 0"), (dict(temperature=-1.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"), (dict(top_p=0.0), "top_p must be in"),
    (dict(top_p=1.5), "top_p"), (dict(max_new_tokens=0), "max_new_tokens"), (dict(seed=-1), "seed"),
])
def test_decoding_options_out_of_range_are_refused_with_a_message(bad, message):
    with pytest.raises(ValueError, match=message):
        DecodingOptions(**{"sample": True, **bad})


def test_a_stop_mid_generation_keeps_the_tokens_so_far(tiny_decoders):
    loaded = load_pretrained(str(tiny_decoders["llama"]), device="cpu")
    free = generate(loaded, PROMPT, options=DecodingOptions(max_new_tokens=NEW))
    stream = GenerationStream(loaded.family, loaded.model, loaded.tokenizer, free.prompt_ids.tolist(),
                              DecodingOptions(max_new_tokens=NEW), stop=lambda: len(stream.steps) >= 3)
    assert len(list(stream)) == 3
    result = stream.result()
    assert result.reason == "stopped" and result.new_ids.tolist() == free.new_ids[:3].tolist()
    assert result.candidate_ids.shape == (3, 10) and result.candidate_ids[0, 0] == free.new_ids[0]


def test_the_streamed_text_is_the_reply(tiny_decoders):
    loaded = load_pretrained(str(tiny_decoders["gpt2"]), device="cpu")
    ids = prompt_ids(loaded.tokenizer, PROMPT, False)
    stream = GenerationStream(loaded.family, loaded.model, loaded.tokenizer, ids,
                              DecodingOptions(max_new_tokens=NEW))
    assert "".join(stream.text_chunks()) == stream.result().reply
    result = stream.result()
    assert result.reply == loaded.tokenizer.decode(result.new_ids.tolist(), skip_special_tokens=True)


def test_a_prompt_with_no_room_left_is_refused(tiny_decoders):
    loaded = load_pretrained(str(tiny_decoders["gpt2"]), device="cpu")
    ids = prompt_ids(loaded.tokenizer, PROMPT, False)
    with pytest.raises(ValueError, match="no room"):
        GenerationStream(loaded.family, loaded.model, loaded.tokenizer, ids * 40, DecodingOptions())
    with pytest.raises(ValueError, match="at most 3 new tokens"):
        GenerationStream(loaded.family, loaded.model, loaded.tokenizer, ids, DecodingOptions(max_new_tokens=4),
                         limit=len(ids) + 3)


def test_an_encoder_does_not_generate():
    from model_core.families import family_named

    with pytest.raises(NotADecoder, match="generating text needs a decoder"):
        GenerationStream(family_named("bert"), None, None, [1, 2], DecodingOptions())


@pytest.mark.slow
@pytest.mark.parametrize("chat", [False, True])
def test_smollm2_greedy_equals_transformers_generate(chat):
    from transformers import AutoModelForCausalLM

    from model_core.models.bundled import ensure_bundled_decoder
    from model_core.settings import BUNDLED_DECODER_ID

    loaded = load_pretrained(BUNDLED_DECODER_ID, device="cpu")
    prompt = "What is the capital of France? Answer in one sentence."
    result = generate(loaded, prompt, chat=chat, options=DecodingOptions(max_new_tokens=24))
    ids = prompt_ids(loaded.tokenizer, prompt, chat)
    # A plain transformers model of its own, from the same folder: not the loaded model, whose attention is ours.
    reference = AutoModelForCausalLM.from_pretrained(str(ensure_bundled_decoder()), attn_implementation="eager",
                                                     dtype=torch.float32).eval()
    with torch.no_grad():
        out = reference.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=24, do_sample=False)
    assert result.new_ids.tolist() == out[0, len(ids):].tolist()
    if chat:
        assert result.reason == "eos" and result.new_ids[-1] == loaded.tokenizer.eos_token_id
