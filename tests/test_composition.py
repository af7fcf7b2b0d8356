"""Composition scores (model_core.qk.composition): a planted K-composition stands out of the baseline, the fast path
equals the naive float64 (d_model, d_model) formula, the norms are folded as TransformerLens folds them, pairs that
cannot compose are null, and the command line prints the one JSON object."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from model_core.families.weights import LayerWeights, layer_weights
from model_core.qk.composition import (
    KINDS,
    CompositionScores,
    composition_scores,
    fold_heads,
)

ROOT = Path(__file__).resolve().parents[1]
SMOL = "bundled:SmolLM2-135M-Instruct"


def _layer(W_Q, W_K, W_V, W_O, *, kv=None, **norms) -> LayerWeights:
    """Hand-made weights of one layer (no biases); ``norms``: ln1_w, ln1_kind, out_norm_w, ..."""
    n_heads, _, d_head = W_Q.shape
    fields = {"b_Q": None, "b_K": None, "b_V": None, "b_O": None, "ln1_w": None, "ln1_b": None, "ln1_kind": None,
              "ln1_eps": 0.0}
    fields.update(norms)
    return LayerWeights(W_Q, W_K, W_V, W_O, kv_of_head=kv or tuple(range(n_heads)), scale=1 / math.sqrt(d_head),
                        **fields)


def _random_layers(n_layers=3, n_heads=2, d_model=32, d_head=4, n_kv=None, seed=0, **norms) -> list[LayerWeights]:
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)
    n_kv = n_kv or n_heads
    kv = tuple(h // (n_heads // n_kv) for h in range(n_heads))
    return [_layer(rnd(n_heads, d_model, d_head), rnd(n_kv, d_model, d_head), rnd(n_kv, d_model, d_head),
                   rnd(n_heads, d_head, d_model), kv=kv, **norms) for _ in range(n_layers)]


def _naive(weights: list[LayerWeights]) -> dict[str, np.ndarray]:
    """The definition, pair by pair, with (d_model, d_model) W_OV and W_QK in float64, from the folded weights."""
    heads = fold_heads(weights, torch.float64)
    n, per = heads.W_Q.shape[0], heads.n_heads
    out = {kind: np.full((n, n), np.nan) for kind in KINDS}
    for a in range(n):
        ov = heads.ov(a)
        for b in range(n):
            if a // per >= b // per:
                continue
            qk, ov2 = heads.qk(b), heads.ov(b)
            for kind, right in (("q", qk), ("k", qk.T), ("v", ov2)):
                norms = torch.linalg.norm(ov) * torch.linalg.norm(right)
                out[kind][a, b] = float(torch.linalg.norm(ov @ right) / norms)
    return out


def test_planted_k_composition_stands_out():
    """L1H0's W_K reads exactly what L0H0's W_O writes: K-composition of that pair is far above the random baseline;
    every other pair and kind stays near it."""
    d_model, d_head, n_heads = 256, 8, 2
    layers = _random_layers(2, n_heads, d_model, d_head, seed=0)
    W_K = layers[1].W_K.clone()
    W_K[0] = layers[0].W_O[0].T  # (d_model, d_head): reads the subspace L0H0 writes
    layers[1] = _layer(layers[1].W_Q, W_K, layers[1].W_V, layers[1].W_O)
    scores = composition_scores(layers)
    base = scores.baseline["k"]
    assert scores.k[0, n_heads] > 4 * base
    for kind in KINDS:
        block = scores.scores(kind)[:n_heads, n_heads:].copy()
        if kind == "k":
            block[0, 0] = np.nan
        assert np.nanmax(block) < 1.5 * base and np.nanmin(block) > 0.5 * base, (kind, block, base)
    assert scores.top_pairs("k", 1)[0][1:5] == (0, 0, 1, 0)


@pytest.mark.parametrize("family", ["llama", "gpt2", "gemma2", "qwen3"])
def test_fast_path_equals_naive_float64_reference(tiny_decoders, family):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_decoders[family], attn_implementation="eager").eval()
    weights = layer_weights(model)
    scores, reference = composition_scores(model), _naive(weights)
    for kind in KINDS:
        np.testing.assert_allclose(scores.scores(kind), reference[kind], rtol=1e-5, atol=1e-7, err_msg=kind)


def test_grouped_query_attention_equals_naive():
    layers = _random_layers(3, n_heads=6, d_model=40, d_head=5, n_kv=2, seed=3)
    scores, reference = composition_scores(layers), _naive(layers)
    for kind in KINDS:
        np.testing.assert_allclose(scores.scores(kind), reference[kind], rtol=1e-5, atol=1e-7, err_msg=kind)


def test_null_where_a_pair_cannot_compose():
    layers = _random_layers(3, n_heads=2)
    scores = composition_scores(layers)
    layer = np.arange(6) // 2
    composes = layer[:, None] < layer[None, :]
    for kind in KINDS:
        grid = scores.scores(kind)
        assert np.isnan(grid[~composes]).all() and np.isfinite(grid[composes]).all()
        assert (grid[composes] > 0).all() and (grid[composes] <= 1).all()
    data = json.loads(json.dumps(scores.to_json()))
    assert set(data) == {"q", "k", "v", "baseline"} and set(data["baseline"]) == set(KINDS)
    for kind in KINDS:
        cells = np.array(data[kind], dtype=object)
        assert ((cells == None) == ~composes).all()
        np.testing.assert_array_equal(np.array(data[kind], dtype=float), scores.scores(kind))  # full precision


def test_rms_scale_is_folded_into_the_reading_weights():
    """A layer whose RMSNorm scales features by w scores as the same layer with w multiplied into W_Q, W_K, W_V."""
    gen = torch.Generator().manual_seed(5)
    w = [1.0 + torch.rand(32, generator=gen, dtype=torch.float64) * 3 for _ in range(3)]
    plain = _random_layers(3)
    normed = [_layer(lw.W_Q, lw.W_K, lw.W_V, lw.W_O, ln1_w=s, ln1_kind="rms") for lw, s in zip(plain, w)]
    multiplied = [_layer(lw.W_Q * s[:, None], lw.W_K * s[:, None], lw.W_V * s[:, None], lw.W_O,
                         ln1_w=torch.ones(32, dtype=torch.float64), ln1_kind="rms") for lw, s in zip(plain, w)]
    a, b, c = composition_scores(normed), composition_scores(multiplied), composition_scores(plain)
    for kind in KINDS:
        np.testing.assert_allclose(a.scores(kind), b.scores(kind), rtol=1e-6)
    assert not np.allclose(a.k, c.k, equal_nan=True)  # the scale matters: a fold that ignored it would fail above


def test_layer_norm_centres_reads_and_writes():
    """Under LayerNorm, what a head writes along the all-ones direction and what W_Q/W_K/W_V read of it are removed
    (TransformerLens's centring): adding it changes no score."""
    ones = torch.ones(32, dtype=torch.float64)
    plain = [_layer(lw.W_Q, lw.W_K, lw.W_V, lw.W_O, ln1_w=ones, ln1_kind="layer") for lw in _random_layers(3)]
    gen = torch.Generator().manual_seed(7)
    shift = lambda t, dim: t + torch.randn(*(s if i != dim else 1 for i, s in enumerate(t.shape)),
                                           generator=gen, dtype=torch.float64)
    shifted = [_layer(shift(lw.W_Q, 1), shift(lw.W_K, 1), shift(lw.W_V, 1), shift(lw.W_O, 2), ln1_w=ones,
                      ln1_kind="layer") for lw in plain]
    a, b = composition_scores(plain), composition_scores(shifted)
    for kind in KINDS:
        np.testing.assert_allclose(a.scores(kind), b.scores(kind), rtol=1e-6)
    rms = [_layer(lw.W_Q, lw.W_K, lw.W_V, lw.W_O, ln1_w=ones, ln1_kind="rms") for lw in shifted]
    assert not np.allclose(composition_scores(rms).k, a.k, equal_nan=True)  # RMSNorm does not centre


def test_attention_output_norm_is_folded_into_w_o():
    gen = torch.Generator().manual_seed(9)
    scale = 0.2 + torch.rand(32, generator=gen, dtype=torch.float64) * 3
    plain = _random_layers(3)
    normed = [_layer(lw.W_Q, lw.W_K, lw.W_V, lw.W_O, out_norm_w=scale) for lw in plain]
    multiplied = [_layer(lw.W_Q, lw.W_K, lw.W_V, lw.W_O * scale) for lw in plain]
    for kind in KINDS:
        np.testing.assert_allclose(composition_scores(normed).scores(kind),
                                   composition_scores(multiplied).scores(kind), rtol=1e-6)


def test_top_pairs_are_the_highest_scores_in_order():
    scores = composition_scores(_random_layers(4, n_heads=3))
    top = scores.top_pairs("v", 5)
    values = np.sort(scores.v[np.isfinite(scores.v)])[::-1][:5]
    np.testing.assert_allclose([p.score for p in top], values)
    for p in top:
        assert p.source_layer < p.target_layer
        assert scores.v[p.source_layer * 3 + p.source_head, p.target_layer * 3 + p.target_head] == p.score
        assert p.ratio == pytest.approx(p.score / scores.baseline["v"])


def test_encoders_compose_with_nothing_folded():
    from transformers import BertConfig, BertModel

    from model_core.chapter3.config import EncoderConfig
    from model_core.chapter3.model import build_random_model

    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                intermediate_size=64, max_position_embeddings=16)).eval()
    custom = build_random_model(EncoderConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=4, intermediate_size=64, max_position_embeddings=16))
    for model, n in ((bert, 12), (custom, 8)):
        scores = composition_scores(model)
        assert scores.q.shape == (n, n) and np.isfinite(scores.q[:4, 4:]).all()
    assert any("post-LN" in f for f in composition_scores(bert).folded)
    assert any("LayerNorm" in f for f in composition_scores(custom).folded)  # pre-LN: its norm is folded


def test_scores_reject_a_wrong_shape():
    with pytest.raises(ValueError, match="must be"):
        CompositionScores(np.zeros((3, 3)), np.zeros((4, 4)), np.zeros((4, 4)), dict.fromkeys(KINDS, 0.1), 2, 2)
    with pytest.raises(ValueError, match="two layers"):
        composition_scores(_random_layers(1))


def test_cli_prints_one_json_object_for_smollm2():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, "-m", "model_core", "composition", "--model", "pretrained", "--model-id",
                          SMOL, "--device", "cpu", "--json"], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=600, check=False)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)  # stdout holds exactly one JSON object
    assert set(data) == {"q", "k", "v", "baseline"}
    layer = np.arange(270) // 9
    composes = layer[:, None] < layer[None, :]
    for kind in KINDS:
        cells = np.array(data[kind], dtype=object)
        assert cells.shape == (270, 270)
        assert ((cells == None) == ~composes).all()
        values = cells[composes].astype(float)
        assert (values > 0).all() and (values < 1).all()
        assert 0 < data["baseline"][kind] < values.max()


def test_cli_error_is_one_line_and_exit_1():
    from harness.cli import run_cli  # the tests' harness: the command line in this process

    out = run_cli("composition", "--model", "pretrained", "--model-id", str(ROOT / "no-such-model-folder"), "--json",
                  env={"HF_HUB_OFFLINE": "1"})
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip().startswith("error: ") and len(out.stderr.strip().splitlines()) == 1, out.stderr


def _render_script() -> None:
    import sys
    from pathlib import Path

    import streamlit as st

    sys.path[:0] = [st.session_state["tests"], str(Path(st.session_state["tests"]).parent)]  # the tests, the app
    from test_composition import _random_layers

    from model_core.qk.composition import composition_scores
    from ui.composition import render_composition

    scores = composition_scores(_random_layers(3, n_heads=2))
    render_composition(scores, top=3, open_url=lambda layer, head: f"heatmaps?layer={layer}&head={head}")


def test_render_composition_draws_a_tab_a_kind_and_the_pairs_with_links():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_render_script)
    at.session_state["tests"] = str(ROOT / "tests")
    at.run(timeout=120)
    assert not at.exception, at.exception
    assert [t.label for t in at.tabs] == ["Q-composition", "K-composition", "V-composition"]
    assert len(at.get("plotly_chart")) == 3 and len(at.get("download_button")) == 3
    frame = at.dataframe[0].value
    assert len(frame) == 9 and set(frame["kind"]) == {"Q-composition", "K-composition", "V-composition"}
    first = frame.iloc[0]
    assert first["open earlier"] == "heatmaps?layer={}&head={}".format(*first["earlier head"][1:].split("H"))


def test_grid_csv_has_every_head_and_empty_cells_where_pairs_cannot_compose():
    from ui.composition import grid_csv

    scores = composition_scores(_random_layers(2, n_heads=2))
    lines = grid_csv(scores, "k").splitlines()
    assert lines[0].split(",")[1:] == ["L0H0", "L0H1", "L1H0", "L1H1"]
    row = lines[1].split(",")
    assert row[0] == "L0H0" and row[1:3] == ["", ""] and float(row[3]) == scores.k[0, 2]
    assert lines[3].split(",")[1:] == ["", "", "", ""]  # L1H0 composes with no later head


def test_notebook_composition_returns_the_scores_and_the_q_k_v_figure(tiny_decoders):
    import attention_explorer as ae

    result = ae.composition(str(tiny_decoders["qwen2"]), device="cpu")
    assert result.scores.q.shape == (8, 8)
    assert [trace.visible for trace in result.figure.data] == [False, True, False]  # K shown first
    np.testing.assert_array_equal(np.asarray(result.figure.data[1].z, dtype=float),
                                  result.scores.k.astype(np.float32))
    assert len(result.table(2)) == 6 and result.to_json()["baseline"] == result.scores.to_json()["baseline"]


def test_a_stop_check_ends_the_scores_at_a_step_and_keeps_nothing():
    """The app's Stop (a stop check, ``model_core.gate``) ends the scores between two layers' products; a stopped
    run leaves the next one's numbers those of a run never stopped."""
    from model_core.gate import stopping_with

    class Stopped(Exception):
        pass

    weights = _random_layers(n_layers=4)
    before = composition_scores(weights, samples=50)
    calls = []

    def check() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise Stopped

    with pytest.raises(Stopped), stopping_with(check):
        composition_scores(weights, samples=50)
    assert len(calls) == 2
    after = composition_scores(weights, samples=50)
    for kind in ("q", "k", "v"):
        np.testing.assert_array_equal(getattr(before, kind), getattr(after, kind))
