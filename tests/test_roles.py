"""Role scores: each equals a naive loop; the probe's batch equals the app's traces; determinism; retrieval; CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from model_core.trace.request import TraceRequest, build_trace
from model_core.roles import (
    RoleInput,
    probe_request,
    probe_texts,
    role_scores,
    score_roles,
)
from model_core.roles.retrieval import copy_hits, retrieval_scores

REPEATED = "the cat sat on the mat and the cat sat on the bank"
CUSTOM = TraceRequest("custom", REPEATED, num_hidden_layers=2, num_attention_heads=4, hidden_size=64, causal=True, seed=1)


def _naive(x: RoleInput) -> dict[str, np.ndarray]:
    """Every role by plain loops over layers, heads and positions."""
    att, ids, special = x.weights, x.token_ids.tolist(), x.special.tolist()
    n_layers, n_heads, n, _ = att.shape
    out = {r: np.zeros((n_layers, n_heads)) for r in ("previous_token", "duplicate_token", "induction", "sink")}
    for la in range(n_layers):
        for h in range(n_heads):
            a = att[la, h]
            out["previous_token"][la, h] = sum(a[i, i - 1] for i in range(1, n)) / (n - 1)
            out["sink"][la, h] = sum(a[i, 0] for i in range(n)) / n
            dup_rows, dup = 0, 0.0
            ind_rows, ind = 0, 0.0
            for q in range(n):
                if special[q]:
                    continue
                others = [k for k in range(n) if k != q and ids[k] == ids[q] and not special[k] and x.mask[q, k]]
                if others:
                    dup_rows += 1
                    dup += sum(a[q, k] for k in others)
                earlier = [p for p in range(q) if ids[p] == ids[q] and not special[p]]
                if earlier and earlier[-1] + 1 < q:
                    ind_rows += 1
                    ind += a[q, earlier[-1] + 1]
            out["duplicate_token"][la, h] = dup / dup_rows if dup_rows else np.nan
            out["induction"][la, h] = ind / ind_rows if ind_rows else np.nan
    return out


def _check(trace) -> None:
    fast = role_scores(trace)
    slow = _naive(RoleInput.from_trace(trace))
    for role, grid in slow.items():
        np.testing.assert_allclose(fast[role], grid, atol=1e-6, err_msg=role)
        assert np.isfinite(grid).all(), role  # the text repeats words: every role is defined


def test_scores_equal_a_naive_loop_on_each_tiny_decoder(tiny_decoder):
    _check(build_trace(TraceRequest("pretrained", REPEATED, model_id=str(tiny_decoder)), device="cpu"))


def test_scores_equal_a_naive_loop_on_the_custom_encoder():
    _check(build_trace(CUSTOM, device="cpu"))
    _check(build_trace(TraceRequest("custom", REPEATED, num_hidden_layers=2, num_attention_heads=4, hidden_size=64), device="cpu"))


def test_scores_equal_a_naive_loop_on_bert():
    _check(build_trace(TraceRequest("pretrained", REPEATED), device="cpu"))


def test_previous_token_and_sink_are_the_head_statistics(tiny_decoders):
    from model_core.analysis import head_stats

    for request in (TraceRequest("pretrained", REPEATED, model_id=str(tiny_decoders["llama"])), CUSTOM,
                    TraceRequest("pretrained", REPEATED)):
        trace = build_trace(request, device="cpu")
        scores, stats = role_scores(trace), head_stats(trace)
        np.testing.assert_allclose(scores["previous_token"], stats.to_prev, atol=1e-6)
        np.testing.assert_allclose(scores["sink"], stats.to_cls, atol=1e-6)


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2"])
def test_the_probes_batch_equals_the_traces_the_heatmaps_page_opens(tiny_decoders, family):
    request = TraceRequest("pretrained", model_id=str(tiny_decoders[family]))
    scores = score_roles(request, seed=5, n_sequences=3, seq_len=12, device="cpu")
    per_text = [role_scores(build_trace(probe_request(request, t), device="cpu")) for t in scores.texts]
    for role, grid in scores.scores.items():
        np.testing.assert_allclose(grid, np.mean([s[role] for s in per_text], axis=0), atol=1e-5, err_msg=role)


def test_the_probes_batch_equals_the_traces_on_the_custom_encoder():
    request = TraceRequest("custom", num_hidden_layers=2, num_attention_heads=4, hidden_size=64)  # bidirectional: pads masked
    scores = score_roles(request, seed=5, n_sequences=3, seq_len=12, device="cpu")
    per_text = [role_scores(build_trace(probe_request(request, t), device="cpu")) for t in scores.texts]
    for role, grid in scores.scores.items():
        np.testing.assert_allclose(grid, np.mean([s[role] for s in per_text], axis=0), atol=1e-5, err_msg=role)
    assert "induction" in scores.notes  # a bidirectional encoder says what its induction score means


def test_probe_texts_repeat_distinct_words_and_follow_the_seed(tiny_decoders):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_decoders["gpt2"])
    texts = probe_texts(tok, seed=1, n_sequences=2, seq_len=10)
    assert texts == probe_texts(tok, seed=1, n_sequences=2, seq_len=10)
    assert texts != probe_texts(tok, seed=2, n_sequences=2, seq_len=10)
    for text in texts:
        words = text.split()
        assert len(words) == 20 and words[:10] == words[10:] and len(set(words[:10])) == 10
    with pytest.raises(ValueError, match="Lower seq_len"):
        probe_texts(tok, seed=1, seq_len=500)


def test_copy_hits_equal_a_naive_loop():
    rng = np.random.default_rng(0)
    rows = rng.random((3, 4, 20))
    ids = rng.integers(0, 5, size=20)
    answer = np.array([7, 8, 9])
    for token in range(5):
        got = copy_hits(rows, token, answer, ids)
        for la in range(3):
            for h in range(4):
                j = int(np.argmax(rows[la, h]))
                assert got[la, h] == (j in answer.tolist() and ids[j] == token)


def test_retrieval_runs_on_a_tiny_decoder_and_is_deterministic(tiny_decoders):
    request = TraceRequest("pretrained", model_id=str(tiny_decoders["llama"]))
    steps = []
    a = retrieval_scores(request, seed=0, depths=(0.5,), device="cpu", on_step=lambda d, t: steps.append((d, t)))
    b = retrieval_scores(request, seed=0, depths=(0.5,), device="cpu")
    assert a.scores.shape == (2, 4) and ((a.scores >= 0) & (a.scores <= 1)).all()
    np.testing.assert_array_equal(a.scores, b.scores)
    assert a.answers == b.answers and steps[-1][0] == steps[-1][1]


def test_retrieval_refuses_an_encoder():
    with pytest.raises(ValueError, match="encoder generates nothing"):
        retrieval_scores(CUSTOM, device="cpu")


def test_cli_prints_every_role_of_a_tiny_decoder_as_json(tiny_decoders, capsys):
    from model_core.__main__ import main

    assert main(["roles", "--model", "pretrained", "--model-id", str(tiny_decoders["gpt2"]), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["roles"]) == {"previous_token", "duplicate_token", "induction", "sink", "retrieval"}
    for body in out["roles"].values():
        assert np.shape(body["scores"]) == (2, 4) and body["top_heads"]
    assert "one-token words" in out["roles"]["induction"]["note"]  # the tiny vocabulary shortens the sequences
    assert max(out["retrieval"]["prompt_tokens"]) <= 128  # the haystack is cut to GPT-2's position table


def test_cli_roles_json_for_the_custom_encoder(capsys):
    from model_core.__main__ import main

    assert main(["roles", "--model", "custom", "--layers", "2", "--heads", "3", "--hidden", "48", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["roles"]) == {"previous_token", "duplicate_token", "induction", "sink", "retrieval"}
    for body in out["roles"].values():
        assert np.shape(body["scores"]) == (2, 3)
    assert out["roles"]["retrieval"]["top_heads"] == [] and "encoder" in out["roles"]["retrieval"]["note"]
    assert len(out["roles"]["induction"]["top_heads"]) == 6


def test_cli_bad_model_id_is_one_line(capsys):
    from model_core.__main__ import main

    assert main(["roles", "--model", "pretrained", "--model-id", "/no/such/folder-xyz", "--json"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


@pytest.mark.slow
def test_smollm2_has_an_induction_head_above_one_half():
    scores = score_roles(TraceRequest("pretrained", model_id="bundled:SmolLM2-135M-Instruct"), seed=0, device="cpu")
    layer, head, score = scores.top_heads("induction", 1)[0]
    assert score > 0.5, (layer, head, score)
    assert scores.shape == (30, 9)


def test_the_notebook_api_scores_roles_on_a_text_and_on_the_models_probe():
    import attention_explorer as ae

    t = ae.trace("the cat sat on the mat and the cat sat on the rug")
    roles = t.roles()
    assert set(roles) == {"previous_token", "duplicate_token", "sink", "induction"}
    expected = role_scores(t.core, tuple(roles))
    for role, grid in roles.items():
        assert grid.shape == (6, 12) and np.isfinite(grid).all(), role  # the text repeats: every role applies
        np.testing.assert_array_equal(grid, expected[role])
    probe = ae.head_roles(seed=1)  # the bundled MiniLM: an encoder, so retrieval is not asked for
    assert probe.scores["induction"].shape == (6, 12) and probe.seed == 1 and "retrieval" not in probe.scores


def test_top_heads_are_the_highest_scores_best_first_without_undefined_ones():
    from model_core.roles.probes import top_heads

    grid = np.array([[0.2, np.nan, 0.9], [0.5, 0.9, 0.1]])
    # by hand: 0.9 twice (the stable order of a descending sort puts the later head first), then 0.5; NaN never
    assert top_heads(grid, 3) == [(1, 1, 0.9), (0, 2, 0.9), (1, 0, 0.5)]
    assert [h[:2] for h in top_heads(grid, 10)] == [(1, 1), (0, 2), (1, 0), (0, 0), (1, 2)]
    assert top_heads(np.full((2, 2), np.nan)) == []
