"""Activation patching's inputs: each bad input gets a message that says what to change; the ``patch`` verb prints
its JSON or exits 1 with the message; the team's ready pairs hold on the bundled SmolLM2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tiny_models import build_tiny_decoder, tiny_tokenizer

from model_core.effects.patching_inputs import (
    PatchingError,
    check_inputs,
    describe_difference,
)
from model_core.families import FAMILIES
from model_core.families.checks import NotADecoder, NotOneToken


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("patch-tok"))


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    return build_tiny_decoder("gpt2", tmp_path_factory.mktemp("patch-cli") / "gpt2")


def _check(tokenizer, clean: str, corrupt: str, answer: str = " cat", foil: str = " bank"):
    ids = lambda text: tokenizer(text)["input_ids"]
    return check_inputs(tokenizer, FAMILIES["gpt2"], ids(clean), ids(corrupt), answer, foil)


def test_good_inputs_name_the_differing_positions(tokenizer):
    inputs = _check(tokenizer, "The cat sat on the mat", "The bank sat on the mat")
    assert inputs.differing.tolist() == [1] and inputs.clean_tokens[1] == " cat" and inputs.corrupt_tokens[1] == " bank"
    assert inputs.answer_id != inputs.foil_id


def test_prompts_of_different_lengths_say_both_counts_and_which_tokens_differ(tokenizer):
    with pytest.raises(PatchingError) as err:
        _check(tokenizer, "The cat sat on the mat", "The river sat on the mat")
    message = str(err.value)
    assert "7 tokens and the corrupted prompt 8" in message
    assert "They differ here: clean 1 ' cat' → corrupted 1-2 ' r' 'iver'" in message


def test_an_answer_of_two_tokens_shows_its_pieces(tokenizer):
    with pytest.raises(NotOneToken, match=r"The answer ' river' is 2 tokens for this model: ' r\w*' \+ '\w+'"):
        _check(tokenizer, "The cat sat on the mat", "The bank sat on the mat", answer=" river")
    with pytest.raises(NotOneToken, match="The foil is empty"):
        _check(tokenizer, "The cat sat on the mat", "The bank sat on the mat", foil="")


def test_the_same_prompt_twice_or_the_answer_as_foil_cannot_be_normalised(tokenizer):
    with pytest.raises(PatchingError, match="same tokens"):
        _check(tokenizer, "The cat sat on the mat", "The cat sat on the mat")
    with pytest.raises(PatchingError, match="always 0"):
        _check(tokenizer, "The cat sat on the mat", "The bank sat on the mat", foil=" cat")


def test_an_encoder_is_refused_with_the_reason_and_the_graph(tokenizer):
    with pytest.raises(NotADecoder, match="predicts no next.*Contributions page"):
        check_inputs(tokenizer, FAMILIES["bert"], [1, 2], [1, 3], " cat", " bank")


def test_equal_metrics_say_so():
    from test_patching_planted import _inputs, planted_model

    from model_core.effects.patching import prepare_runs

    model, family = planted_model(with_head=False)
    model.transformer.h[0].attn.c_proj.weight.zero_()  # the weak copy too: nothing carries the name
    with pytest.raises(PatchingError, match="same metric"):
        prepare_runs(family, model, _inputs())


def test_describe_difference_lists_the_changed_spans():
    text = describe_difference(("a", " b", " c"), ("a", " x", " y", " c"))
    assert text == "clean 1 ' b' → corrupted 1-2 ' x' ' y'"


def test_the_patch_verb_prints_its_json(gpt2, capsys):
    from model_core.cli.main import main

    code = main(["patch", "--model", "pretrained", "--model-id", str(gpt2), "--clean", "The cat sat on the mat",
                 "--corrupt", "The bank sat on the mat", "--answer", " cat", "--foil", " bank", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert np.asarray(out["heads"]).shape == (2, 4) and np.asarray(out["attribution"]).shape == (2, 4)
    assert np.asarray(out["residual"]).shape == (2, 7)
    assert out["clean"] != out["corrupt"] and out["differing"] == [1] and not out["partial"]
    assert {"attention", "norm_weighted", "dla", "effect"} <= set(out["table"][0])


@pytest.mark.parametrize("argv, expected", [
    (["--corrupt", "The river sat on the mat"], "7 tokens and the corrupted prompt 8"),
    (["--answer", " river"], "is 2 tokens for this model"),
    (["--corrupt", "The cat sat on the mat"], "same tokens"),
])
def test_the_patch_verb_exits_1_with_the_message(gpt2, capsys, argv, expected):
    from model_core.cli.main import main

    base = {"--clean": "The cat sat on the mat", "--corrupt": "The bank sat on the mat", "--answer": " cat",
            "--foil": " bank"}
    base.update(dict(zip(argv[::2], argv[1::2])))
    args = ["patch", "--model", "pretrained", "--model-id", str(gpt2), *[x for kv in base.items() for x in kv]]
    assert main(args) == 1
    assert expected in capsys.readouterr().err


def test_the_patch_verb_refuses_the_custom_encoder(capsys):
    from model_core.cli.main import main

    assert main(["patch", "--model", "custom", "--clean", "a b", "--corrupt", "a c", "--answer", " b",
                 "--foil", " c"]) == 1
    assert "predicts no next token" in capsys.readouterr().err


@pytest.mark.slow
def test_the_ready_pairs_hold_on_the_bundled_smollm2():
    from model_core.effects.pairs import READY_PAIRS
    from model_core.effects.patching import patched_metrics, prepare_runs
    from model_core.effects.patching_attribution import attribution_patching
    from model_core.effects.patching_inputs import prepare_inputs
    from model_core.settings import BUNDLED_DECODER_ID
    from model_core.trace.request import TraceRequest
    from model_core.trace.resolve import resolve

    resolved = resolve(TraceRequest("pretrained", "x", model_id=BUNDLED_DECODER_ID), device="cpu")
    for pair in READY_PAIRS:
        inputs = prepare_inputs(resolved, pair.clean, pair.corrupt, pair.answer, pair.foil)  # same length, 1 token
        runs = prepare_runs(resolved.family, resolved.model, inputs)
        assert runs.clean > 0 > runs.corrupt, pair.name  # the model gives the answer, then the foil
        estimate = attribution_patching(resolved.family, resolved.model, runs)
        top = np.argsort(-np.abs(estimate.heads), axis=None)[:3]
        patches = [("z", int(i // runs.n_heads), int(i % runs.n_heads)) for i in top]
        exact = runs.effect(patched_metrics(resolved.family, resolved.model, runs, patches))
        assert np.abs(exact).max() > 0.1, pair.name  # the estimate's top heads matter when patched exactly
