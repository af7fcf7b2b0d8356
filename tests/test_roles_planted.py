"""A planted circuit: a two-layer attention-only GPT-2, built by hand so that layer 0 head 0 attends to the
previous token and copies it forward, and layer 1 head 0 is an induction head reading that copy. The role probes,
run through the app's one forward route, must find both; with the previous-token head removed they must not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_models import SPECIAL_TOKEN, tiny_tokenizer

TOK, POS, PREV = slice(0, 32), slice(32, 64), slice(64, 96)  # the residual stream's three subspaces
HIDDEN, HEADS, D_HEAD = 96, 2, 48
PERIODS = (3.1, 4.7, 7.3, 11.0, 17.0, 29.0, 53.0, 97.0)  # one sine/cosine pair per period, x2 with signs flipped
SHARP = 12.0  # score multiplier: makes the planted heads nearly one-hot


def _position_codes(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Zero-mean, norm-1 codes p(i) and the rotation R with R p(i) = p(i - 1). Shape: (n, 32), (32, 32)."""
    codes = np.zeros((n, 32))
    rot = np.zeros((32, 32))
    for f, period in enumerate(PERIODS):
        w = 2 * np.pi / period
        angle = w * np.arange(n)
        c, s = np.cos(angle), np.sin(angle)
        codes[:, 4 * f: 4 * f + 4] = np.stack([c, s, -c, -s], axis=1) / 4
        back = np.array([[np.cos(w), np.sin(w)], [-np.sin(w), np.cos(w)]])  # rotates angle a to a - w
        rot[4 * f: 4 * f + 2, 4 * f: 4 * f + 2] = back
        rot[4 * f + 2: 4 * f + 4, 4 * f + 2: 4 * f + 4] = back
    return codes, rot


def build_planted(folder, previous_token_head: bool = True):
    """Save the hand-built model and the tiny tokenizer into ``folder``; return it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = tiny_tokenizer(folder)
    special = tokenizer.convert_tokens_to_ids(SPECIAL_TOKEN)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=HIDDEN, n_layer=2, n_head=HEADS,
                        bos_token_id=special, eos_token_id=special, attn_implementation="eager")
    model = GPT2LMHeadModel(config).eval()
    rng = np.random.default_rng(0)
    tok = rng.normal(size=(len(tokenizer), 32))
    tok -= tok.mean(axis=1, keepdims=True)
    tok /= np.linalg.norm(tok, axis=1, keepdims=True)  # zero mean, norm 1: LayerNorm only rescales
    pos, rot = _position_codes(128)
    t = lambda a: torch.as_tensor(a, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.ones_like(param) if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))
                        else torch.zeros_like(param))
        model.transformer.wte.weight[:, TOK] = t(tok)
        model.transformer.wpe.weight[:, POS] = t(pos)
        scale0, scale1 = np.sqrt(HIDDEN / 2), np.sqrt(HIDDEN / 3)  # LayerNorm's gain on a norm-sqrt(2) / sqrt(3) x
        # Conv1D weights are (in, out); c_attn's columns: q (heads x d_head), then k, then v.
        q0, k0, v0 = (model.transformer.h[0].attn.c_attn.weight[:, o: o + 32] for o in (0, HIDDEN, 2 * HIDDEN))
        if previous_token_head:
            q0[POS] = t(rot.T) * SHARP  # q_i = R p(i) = p(i - 1): matches the key of position i - 1
            k0[POS] = t(np.eye(32))
        v0[TOK] = t(np.eye(32))  # value: the token's code ...
        model.transformer.h[0].attn.c_proj.weight[0:32, PREV] = t(np.eye(32) / scale0)  # ... written to PREV
        q1, k1 = (model.transformer.h[1].attn.c_attn.weight[:, o: o + 32] for o in (0, HIDDEN))
        q1[TOK] = t(np.eye(32)) * SHARP * scale0 / scale1  # the current token ...
        k1[PREV] = t(np.eye(32))  # ... against each key's previous token: attends to the token after a copy
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def _scores(folder):
    from model_core.trace.request import TraceRequest
    from model_core.roles import score_roles

    return score_roles(TraceRequest("pretrained", model_id=str(folder)), seed=3, n_sequences=3, seq_len=12,
                       device="cpu")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    return _scores(build_planted(tmp_path_factory.mktemp("planted")))


@pytest.fixture(scope="module")
def removed(tmp_path_factory):
    return _scores(build_planted(tmp_path_factory.mktemp("removed"), previous_token_head=False))


def test_the_planted_previous_token_head_is_found(planted):
    layer, head, score = planted.top_heads("previous_token", 1)[0]
    assert (layer, head) == (0, 0)
    assert score > 0.8


def test_the_planted_induction_head_is_found(planted):
    layer, head, score = planted.top_heads("induction", 1)[0]
    assert (layer, head) == (1, 0)
    assert score > 0.8


def test_without_the_previous_token_head_neither_role_is_found(removed):
    assert removed.scores["previous_token"][0, 0] < 0.3
    assert removed.scores["induction"][1, 0] < 0.3  # induction needs the copy of the previous token
