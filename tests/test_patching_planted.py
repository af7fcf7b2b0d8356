"""A planted circuit: a hand-built two-layer GPT-2 in which one head (layer 1, head 2) copies a name from its
position to the last token, with a weak copy of it in layer 0 (head 1, a tenth as strong). Exact and attribution
patching must find the planted head; with it removed, the weak head is the top one instead. Also:
the rank correlation written with numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model_core.effects.patching_attribution import rank_correlation

VOCAB = 8
BOS, NAME_A, NAME_B, FILLER, QUERY = 0, 1, 2, 3, 4
D_MODEL, N_HEADS = 16, 4
D_HEAD = D_MODEL // N_HEADS
PLANTED = (1, 2)  # (layer, head)
WEAK = (0, 1)
CLEAN = [BOS, NAME_A, FILLER, FILLER, QUERY]
CORRUPT = [BOS, NAME_B, FILLER, FILLER, QUERY]


def planted_model(with_head: bool = True):
    """Layer 0 and the MLPs write nothing; in layer 1 only the planted head writes: its query reads the QUERY
    token, its keys the two names, and its value and output copy the name's embedding into the residual stream,
    where the tied unembedding reads it as that name's logit."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from model_core.families import family_of
    from model_core.families.capture import use_capture

    config = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=D_MODEL, n_layer=2, n_head=N_HEADS,
                        attn_implementation="eager", tie_word_embeddings=True)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.transformer.wte.weight[:, :VOCAB] = 3.0 * torch.eye(VOCAB)  # one-hot token directions
        for ln in [model.transformer.ln_f] + [m for b in model.transformer.h for m in (b.ln_1, b.ln_2)]:
            ln.weight.fill_(1.0)
        for (layer, head), strength in ((PLANTED, 10.0 if with_head else 0.0), (WEAK, 1.0)):
            w = model.transformer.h[layer].attn.c_attn.weight  # Conv1D: (d_model, 3 * d_model) -> q | k | v
            q0, k0, v0 = head * D_HEAD, D_MODEL + head * D_HEAD, 2 * D_MODEL + head * D_HEAD
            w[QUERY, q0] = 4.0
            w[NAME_A, k0] = w[NAME_B, k0] = 4.0
            w[NAME_A, v0], w[NAME_B, v0 + 1] = 1.0, 1.0
            out = model.transformer.h[layer].attn.c_proj.weight  # (head * d_head, d_model)
            out[head * D_HEAD, NAME_A] = out[head * D_HEAD + 1, NAME_B] = strength
    for p in model.parameters():
        p.requires_grad_(False)
    return use_capture(model, list(model.transformer.h)), family_of(model)


def _inputs():
    from model_core.effects.patching_inputs import PatchInputs

    clean, corrupt = np.array(CLEAN), np.array(CORRUPT)
    names = tuple(str(t) for t in CLEAN)
    return PatchInputs(clean, corrupt, names, tuple(str(t) for t in CORRUPT), "A", "B", NAME_A, NAME_B,
                       np.flatnonzero(clean != corrupt))


def find_planted_head(with_head: bool) -> None:
    """The check: patching names the planted head, which carries most of the name; the heads that write nothing
    have no effect."""
    from model_core.effects.patching import exact_patching, prepare_runs
    from model_core.effects.patching_attribution import attribution_patching

    model, family = planted_model(with_head)
    runs = prepare_runs(family, model, _inputs())
    exact = exact_patching(family, model, runs)
    estimate = attribution_patching(family, model, runs)
    assert runs.clean > 0.0 > runs.corrupt  # the model names the name it saw
    assert np.unravel_index(np.argmax(np.abs(exact.heads)), exact.heads.shape) == PLANTED
    assert exact.heads[PLANTED] > 0.5
    silent = np.ones(exact.heads.shape, dtype=bool)
    silent[PLANTED] = silent[WEAK] = False
    assert np.abs(exact.heads[silent]).max() < 1e-6  # heads that write nothing change nothing
    assert np.unravel_index(np.argmax(np.abs(estimate.heads)), estimate.heads.shape) == PLANTED
    assert exact.residual[0, 1] == pytest.approx(1.0, abs=1e-4)  # the name's position carries it in


def test_patching_finds_the_planted_head():
    find_planted_head(with_head=True)


def test_without_the_planted_head_the_weak_copy_is_found():
    """The check above fails on this model: the top head is the weak copy, not the planted one."""
    from model_core.effects.patching import exact_patching, prepare_runs
    from model_core.effects.patching_attribution import attribution_patching

    model, family = planted_model(with_head=False)
    runs = prepare_runs(family, model, _inputs())
    exact = exact_patching(family, model, runs, residual=False)
    estimate = attribution_patching(family, model, runs)
    for grid in (exact.heads, estimate.heads):
        top = np.unravel_index(np.argmax(np.abs(grid)), grid.shape)
        assert top != PLANTED
        assert top == WEAK
    assert abs(exact.heads[PLANTED]) < 1e-6  # the removed head changes nothing


def test_rank_correlation_with_ties_matches_the_formula():
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    y = np.array([5.0, 6.0, 7.0, 8.0, 7.0])  # ranks 1, 2, 3.5, 5, 3.5
    rx, ry = np.array([1, 2, 3, 4, 5.0]), np.array([1, 2, 3.5, 5, 3.5])
    expected = np.corrcoef(rx, ry)[0, 1]
    assert rank_correlation(x, y) == pytest.approx(expected)
    assert rank_correlation(x, np.exp(x)) == pytest.approx(1.0)  # only the order counts
    assert rank_correlation(x, -x ** 3) == pytest.approx(-1.0)


def test_rank_correlation_skips_nan_and_refuses_too_few():
    x = np.array([1.0, np.nan, 3.0, 4.0, 2.0])
    y = np.array([2.0, 9.0, 6.0, 8.0, 4.0])
    assert rank_correlation(x, y) == pytest.approx(1.0)
    assert np.isnan(rank_correlation([1.0, 2.0], [2.0, 1.0]))
    assert np.isnan(rank_correlation([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
