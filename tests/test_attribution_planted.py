"""A planted circuit: a tiny two-layer Llama (tests/tiny_models.py) whose layer-1 head 0 is set by hand to find the
answer token earlier in the text and copy it onto the answer's unembedding at the last position. Direct logit
attribution must rank that head first and trace its effect to the answer's position; with the copy broken in the
head's value (W_O and its attention as planted), its effect falls away."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import HEAD_DIM, build_tiny_decoder

from model_core.effects.attribution import attribute, head_sources, token_id_of

TEXT = "fruit flies like a banana and the cat sat on the"
ANSWER = " banana"
PLANTED = (1, 0)  # layer 1, head 0 (it reads key/value head 0)
LOW = 7  # the head dimension the rotary embedding turns least (10000^(-14/16) rad a position): position-blind
SHRINK = 0.1  # every other head's and every MLP's write is scaled down, not removed


def _unit(v: torch.Tensor) -> torch.Tensor:
    return v / v.norm()


def _plant(model, answer: int, last: int) -> None:
    """Hand-set layer 1, head 0: its query at the last token and its key at the answer both lie along dimension LOW
    (so it attends to the answer), its value reads the answer's embedding, and W_O writes it onto the answer's
    unembedding row."""
    embed, unembed = model.model.embed_tokens.weight, model.lm_head.weight
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(SHRINK)
            layer.mlp.down_proj.weight.mul_(SHRINK)
        attn = model.model.layers[PLANTED[0]].self_attn
        rows = slice(0, HEAD_DIM)  # query head 0 and key/value head 0
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
            proj.weight[rows] = 0.0
        # The layer-1 input is normalised to norm 8 (RMS 1 in 64 dimensions): q and k reach about 16 at the last
        # token and at the answer, a score of 16 * 16 / 4 = 64 there against about 8 * N(0, 1) elsewhere.
        attn.q_proj.weight[LOW] = 2.0 * _unit(embed[last])
        attn.k_proj.weight[LOW] = 2.0 * _unit(embed[answer])
        attn.v_proj.weight[0] = _unit(embed[answer])
        attn.o_proj.weight[:, rows] = 0.0
        attn.o_proj.weight[:, 0] = _unit(unembed[answer])


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    from model_core.models.loading import load_pretrained_uncached

    folder = build_tiny_decoder("llama", tmp_path_factory.mktemp("planted") / "llama")
    loaded = load_pretrained_uncached(str(folder), device="cpu")
    answer = token_id_of(loaded.tokenizer, ANSWER)
    encoded = loaded.family.encode(loaded.tokenizer, TEXT, max_tokens=128)
    _plant(loaded.model, answer, int(encoded.input_ids[0, -1]))
    return loaded, encoded, answer


def _trace(loaded, encoded):
    from model_core.trace.forward import trace_pretrained

    return trace_pretrained(loaded, encoded)


def test_dla_ranks_the_planted_head_first(planted):
    loaded, encoded, answer = planted
    trace = _trace(loaded, encoded)
    assert int(trace.next_token_ids[-1, 0]) == answer  # the circuit works: the model predicts the answer
    got = attribute(trace, loaded.model, loaded.family, answer)
    order = np.argsort(-got.heads.ravel())
    assert np.unravel_index(order[0], got.heads.shape) == PLANTED
    runner_up = np.abs(np.delete(got.heads.ravel(), order[0])).max()
    assert got.heads[PLANTED] > 10 * runner_up
    assert got.heads[PLANTED] > 0.5 * got.logit  # most of the logit comes directly from it
    assert got.top_heads(1)[0][:2] == PLANTED


def test_the_planted_head_reads_the_answers_position(planted):
    loaded, encoded, answer = planted
    trace = _trace(loaded, encoded)
    split = head_sources(trace, loaded.model, loaded.family, *PLANTED, answer)
    where = list(encoded.input_ids[0]).index(answer)
    assert int(np.argmax(split)) == where
    assert split[where] > 0.9 * split.sum()


def _with_value(loaded, encoded, answer, row: torch.Tensor):
    """The attribution and the trace with the planted head's value reading ``row`` instead of the answer's
    embedding (its query, key and W_O as planted), restored after."""
    v_proj = loaded.model.model.layers[PLANTED[0]].self_attn.v_proj
    kept = v_proj.weight[0].clone()
    with torch.no_grad():
        v_proj.weight[0] = row
    try:
        trace = _trace(loaded, encoded)
        return attribute(trace, loaded.model, loaded.family, answer), trace
    finally:
        with torch.no_grad():
            v_proj.weight[0] = kept


def test_breaking_the_copy_removes_the_heads_effect(planted):
    """Break the copy in the head's value, leaving W_O and where it looks as planted: its direct effect must fall
    (the planted test above would then fail), though it still attends to the answer."""
    loaded, encoded, answer = planted
    intact = attribute(_trace(loaded, encoded), loaded.model, loaded.family, answer)
    embed = loaded.model.model.embed_tokens.weight[answer].detach()
    other = torch.randn(embed.shape, generator=torch.Generator().manual_seed(0))
    other = _unit(other - (other @ embed) / (embed @ embed) * embed)  # orthogonal to the answer's embedding
    broken, trace = _with_value(loaded, encoded, answer, other)
    where = list(encoded.input_ids[0]).index(answer)
    assert trace.weights[PLANTED[0], PLANTED[1], -1, where] > 0.9  # attention alone would still name this head
    assert abs(broken.heads[PLANTED]) < 0.1 * intact.heads[PLANTED]
    assert int(trace.next_token_ids[-1, 0]) != answer  # and the model no longer predicts the answer
    silent, _ = _with_value(loaded, encoded, answer, torch.zeros_like(embed))  # the head writes nothing
    assert abs(silent.heads[PLANTED]) < 1e-6
    assert np.unravel_index(np.argmax(silent.heads), silent.heads.shape) != PLANTED
    assert silent.total == pytest.approx(silent.logit, abs=1e-5)
