"""Query–key space and nearest contexts: the sample, AttentionViz's transforms, FAISS against numpy, senses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.cli import run_cli
from model_core import TraceRequest, build_trace
from model_core.corpus import Corpus, CorpusModel, CorpusRunError, RunOptions, demo_corpus, run_corpus
from model_core.corpus.index import brute_force, build_index, normalised
from model_core.corpus.neighbours import neighbours, sample_tokens
from model_core.corpus.qk_space import head_vectors, joint_projection, scale_norms, translate_keys
from model_core.corpus.sample import plan_sample, priorities, read_array

ROOT = Path(__file__).resolve().parents[1]
BERT = CorpusModel.from_options("bert")
SMALL = CorpusModel.from_options("custom", num_hidden_layers=2, num_attention_heads=3, hidden_size=48, seed=1, causal=True)
SAMPLED = RunOptions(batch_size=8, chunk_size=20, sample_cap=150, keep_qk=True, index=True)


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    return run_corpus(demo_corpus(limit=50), SMALL, tmp_path_factory.mktemp("run") / "r", options=SAMPLED,
                      device="cpu")


def test_key_translation_makes_the_centroids_coincide_and_keeps_each_querys_ranking():
    rng = np.random.default_rng(0)
    q, k = rng.normal(2.0, 1.0, (200, 8)), rng.normal(-3.0, 0.5, (300, 8))
    moved = translate_keys(q, k)
    np.testing.assert_allclose(moved.mean(0), q.mean(0), atol=1e-12)
    # q·k' = q·k + (a constant per query): the softmax over keys is unchanged
    shift = q @ moved.T - q @ k.T
    np.testing.assert_allclose(shift, shift[:, :1].repeat(300, axis=1), atol=1e-9)


def test_norm_scaling_equalises_mean_norms_and_keeps_dot_products():
    rng = np.random.default_rng(1)
    q, k = rng.normal(0, 5.0, (100, 6)), rng.normal(0, 0.2, (100, 6))
    q2, k2 = scale_norms(q, k)
    assert np.linalg.norm(q2, axis=1).mean() == pytest.approx(np.linalg.norm(k2, axis=1).mean())
    np.testing.assert_allclose(q2 @ k2.T, q @ k.T, rtol=1e-10)


def test_projections_are_deterministic_with_a_seed():
    rng = np.random.default_rng(2)
    q, k = rng.normal(size=(300, 16)), rng.normal(size=(300, 16))
    a, b = joint_projection(q, k, method="pca"), joint_projection(q, k, method="pca")
    np.testing.assert_array_equal(a.coords, b.coords)
    assert a.coords.shape == (600, 2) and a.is_key.sum() == 300
    sub1, sub2 = joint_projection(q, k, limit=50, seed=3), joint_projection(q, k, limit=50, seed=3)
    np.testing.assert_array_equal(sub1.rows, sub2.rows)
    with pytest.raises(ValueError, match="Unknown projection"):
        joint_projection(q, k, method="mds")


@pytest.mark.slow
@pytest.mark.parametrize("method", ["umap", "tsne"])
def test_umap_and_tsne_are_deterministic_with_a_seed(method):
    pytest.importorskip("umap" if method == "umap" else "sklearn")
    rng = np.random.default_rng(4)
    q, k = rng.normal(size=(150, 8)), rng.normal(size=(150, 8))
    a = joint_projection(q, k, method=method, seed=7).coords
    b = joint_projection(q, k, method=method, seed=7).coords
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_umap_projection_leaves_umaps_compiled_functions_cached_on_disk():
    """umap-learn asks numba to cache one function of about a hundred, so each new process compiled the rest again
    (18 s); ``qk_space.cache_compiled`` turns every one's cache on before the fit."""
    pytest.importorskip("umap")
    from numba.core.dispatcher import Dispatcher

    rng = np.random.default_rng(4)
    joint_projection(rng.normal(size=(40, 8)), rng.normal(size=(40, 8)), method="umap", seed=7)
    import umap.layouts
    import umap.umap_

    jitted = [v for m in (umap.umap_, umap.layouts) for v in vars(m).values() if isinstance(v, Dispatcher)]
    assert len(jitted) >= 10 and all(type(f._cache).__name__ != "NullCache" for f in jitted)
    assert any(f.stats.cache_hits or f.stats.cache_misses for f in jitted)  # the fit went through the caches


def test_sample_is_the_lowest_priorities_and_the_same_however_it_is_planned():
    tokens = {i: list(range(5 + i % 7)) for i in range(40)}
    plan = plan_sample(tokens, cap=30, seed=0)
    all_ids = np.concatenate([np.full(len(v), k) for k, v in tokens.items()])
    all_pos = np.concatenate([np.arange(len(v)) for v in tokens.values()])
    threshold = np.sort(priorities(all_ids, all_pos))[29]
    assert len(plan) == 30 and (priorities(plan.text_id, plan.position) <= threshold).all()
    shuffled = dict(reversed(list(tokens.items())))
    again = plan_sample(shuffled, cap=30, seed=0)
    np.testing.assert_array_equal(again.text_id, plan.text_id)
    np.testing.assert_array_equal(again.position, plan.position)
    assert len(plan_sample(tokens, cap=10_000)) == sum(map(len, tokens.values()))


def test_sampled_vectors_equal_the_one_text_trace(small_run):
    table = sample_tokens(small_run)
    queries, keys, hidden = (read_array(small_run.path, kind) for kind in ("queries", "keys", "hidden"))
    corpus = demo_corpus(limit=50)
    for row in (0, 37, len(table) - 1):
        text_id, pos = int(table["text_id"][row].as_py()), int(table["position"][row].as_py())
        a, b = corpus.texts[text_id]
        trace = build_trace(TraceRequest("custom", a, b, num_hidden_layers=2, num_attention_heads=3, hidden_size=48, seed=1, causal=True), device="cpu")
        assert trace.tokens[pos] == table["token"][row].as_py()
        q = trace.queries[:, :, pos].reshape(2, 48)  # heads side by side
        k = trace.keys[:, :, pos].reshape(2, 48)
        np.testing.assert_allclose(queries[:, row].astype(np.float32), q, atol=5e-3, rtol=5e-3)
        np.testing.assert_allclose(keys[:, row].astype(np.float32), k, atol=5e-3, rtol=5e-3)
        np.testing.assert_allclose(hidden[:, row].astype(np.float32), trace.hidden_states[:, pos], atol=5e-3,
                                   rtol=5e-3)
    q, k = head_vectors(small_run.path, 1, 2, 3)
    assert q.shape == k.shape == (150, 16)


def test_faiss_neighbours_equal_a_brute_force_cosine_top_k():
    rng = np.random.default_rng(5)
    vectors = rng.normal(size=(2000, 32)).astype(np.float32)
    index = build_index(vectors)
    for query in rng.normal(size=(5, 32)).astype(np.float32):
        scores, rows = index.search(normalised(query[None]), 10)
        ref_scores, ref_rows = brute_force(vectors, query, 10)
        np.testing.assert_array_equal(rows[0], ref_rows)
        np.testing.assert_allclose(scores[0], ref_scores, atol=1e-5)


def test_ivf_index_past_the_threshold_finds_most_exact_neighbours():
    rng = np.random.default_rng(6)
    centres = rng.normal(size=(40, 16))
    vectors = (centres[rng.integers(0, 40, 8000)] + 0.3 * rng.normal(size=(8000, 16))).astype(np.float32)
    ivf = build_index(vectors, ivf_from=1000)
    assert type(ivf).__name__.startswith("IndexIVF")
    hits = 0
    for query in vectors[:50]:
        _, rows = ivf.search(normalised(query[None]), 10)
        hits += len(set(rows[0]) & set(brute_force(vectors, query, 10)[1]))
    assert hits / 500 >= 0.9


def test_run_neighbours_equal_numpy_over_the_sampled_hidden_states(small_run):
    found = neighbours(small_run.path, "the bank of the river", position=2, layer=2, k=5, device="cpu")
    hidden = read_array(small_run.path, "hidden")[2].astype(np.float32)
    from model_core.corpus.neighbours import token_states

    tokens, states = token_states(SMALL.load("cpu"), "the bank of the river")
    ref_scores, ref_rows = brute_force(hidden, states[2, 2], 5)
    table = sample_tokens(small_run)
    assert [f["text_index"] for f in found] == [table["text_id"][int(r)].as_py() for r in ref_rows]
    assert [f["score"] for f in found] == pytest.approx(ref_scores.tolist(), abs=1e-4)
    assert set(found[0]) >= {"text_index", "position", "token", "text", "score"}


def test_nearest_contexts_by_layer_are_cached_per_request_causal_flag_and_head_mask_included(small_run):
    """The page's per-layer nearest contexts come from ui.derived's one per-trace cache: two requests that differ
    only in the causal flag (or only in the head mask) get their own results, and each equals a direct search."""
    from model_core.corpus.neighbours import neighbours_of
    from ui.derived import neighbours_by_layer

    shape = dict(seed=1, num_hidden_layers=2, num_attention_heads=3, hidden_size=48)
    stamp = (small_run.path / "manifest.json").stat().st_mtime
    requests = [TraceRequest("custom", "the bank of the river", causal=True, **shape),
                TraceRequest("custom", "the bank of the river", causal=False, **shape),
                TraceRequest("custom", "the bank of the river", causal=True, head_mask=((True,) * 3, (False, True, True)),
                             **shape)]
    results = [neighbours_by_layer(build_trace(r, device="cpu"), str(small_run.path), stamp, 2, 5) for r in requests]
    for request, (_, score, tops) in zip(requests, results):
        trace = build_trace(request, device="cpu")
        last = neighbours_of(small_run, trace.hidden_states, trace.tokens, position=2, layer=2, k=5)
        assert score[2] == pytest.approx(np.mean([f["score"] for f in last]))
        assert tops[2] == " · ".join(f"{f['token']}: {f['text'][:50]}" for f in last[:3])
    causal, bidirectional, masked = (score for _, score, _ in results)
    assert not np.allclose(causal[1:], bidirectional[1:])  # layer 0 (the embeddings) has no attention yet
    assert not np.allclose(causal[2:], masked[2:])  # the mask switches off a head of the last layer


def test_bad_neighbour_requests_say_what_to_do(small_run, tmp_path):
    with pytest.raises(ValueError, match="Position 40 is out of range: the text has 7 tokens"):
        neighbours(small_run.path, "the bank of the river", position=40, layer=1, device="cpu")
    with pytest.raises(ValueError, match="Layer 9 does not exist.*layers 0-2"):
        neighbours(small_run.path, "the bank of the river", position=1, layer=9, device="cpu")
    plain = run_corpus(demo_corpus(limit=10), SMALL, tmp_path / "plain", options=RunOptions(), device="cpu")
    with pytest.raises(CorpusRunError, match="no nearest-context index.*--index"):
        neighbours(plain.path, "the bank", position=1, layer=1, device="cpu")


RIVER = ["we sat on the river bank in the sun.", "the river bank was muddy after the rain.",
         "ducks swam near the grassy bank of the river.", "fishermen lined the bank of the stream.",
         "reeds grew thick along the river bank.", "the boat drifted toward the far bank of the lake.",
         "she walked along the bank of the canal at dawn.", "the flood washed away part of the river bank."]
MONEY = ["she deposited her salary at the bank.", "the bank approved the loan on monday.",
         "he works as a teller at the bank downtown.", "the bank raised its interest rates.",
         "they robbed the bank and fled in a van.", "my bank charges a fee for every transfer.",
         "the central bank cut rates again.", "we opened a savings account at the bank."]


@pytest.mark.slow
def test_late_layers_find_the_same_sense_more_often_than_the_embeddings(tmp_path):
    corpus = Corpus("senses", tuple((t, None) for t in RIVER + MONEY))
    run = run_corpus(corpus, BERT, tmp_path / "senses", options=RunOptions(sample_cap=10_000, index=True),
                     device="cpu")
    loaded = BERT.load("cpu")
    from model_core.corpus.neighbours import neighbours_of, token_states

    def agreement(layer: int) -> float:
        same = total = 0
        for query, river in [(q, True) for q in ("the otters played on the muddy river bank.",)] + \
                            [(q, False) for q in ("he withdrew cash from the bank.",)]:
            tokens, states = token_states(loaded, query)
            found = neighbours_of(run, states, tokens, position=tokens.index("bank"), layer=layer, k=60)
            banks = [f for f in found if f["token"] == "bank"][:6]
            same += sum((f["text_index"] < len(RIVER)) == river for f in banks)
            total += len(banks)
        return same / total

    first, last = agreement(0), agreement(6)
    assert last > first and last >= 0.8, (first, last)


@pytest.mark.slow
def test_cli_neighbours_prints_json_best_first(tmp_path):
    out = tmp_path / "run"
    # The run and the refusal in this process (harness.cli); the neighbours' JSON through a real one
    made = run_cli("corpus", "--input", "demo", "--model", "bert", "--limit", "60", "--index", "--quiet", "--out",
                   str(out))
    assert made.returncode == 0, made.stderr
    result = subprocess.run([sys.executable, "-m", "model_core", "neighbours", "--run", str(out), "--text",
                             "we sat on the river bank", "--position", "6", "--layer", "6", "--k", "5", "--json"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert len(found) == 5 and found[0]["token"] == "bank"
    assert [f["score"] for f in found] == sorted((f["score"] for f in found), reverse=True)
    bad = run_cli("neighbours", "--run", str(out), "--text", "hi", "--position", "9", "--layer", "1", "--json")
    assert bad.returncode == 1 and "out of range" in bad.stderr and "Traceback" not in bad.stderr


def test_a_click_on_the_scatter_maps_back_to_its_row_and_nothing_per_point_but_coords_hover_colour_is_sent():
    from ui.corpus_figures import qk_scatter_figure, scatter_point_row

    rng = np.random.default_rng(0)
    is_key = rng.random(40) < 0.5
    coords = rng.normal(size=(40, 2))
    hover = [f"<b>row</b> {i}" for i in range(40)]
    fig = qk_scatter_figure(coords, is_key, hover, None, "t")
    for curve, trace in enumerate(fig.data):
        for index in range(len(trace.x)):
            row = scatter_point_row(is_key, curve, index)
            assert trace.hovertext[index] == hover[row]
            assert np.isclose(trace.x[index], coords[row, 0], atol=1e-6)
        assert trace.customdata is None
        assert np.asarray(trace.x).dtype == np.float32
    with pytest.raises(ValueError, match="not in trace"):
        scatter_point_row(is_key, 1, int(is_key.sum()))


def test_the_layer_grid_draws_two_traces_per_head_in_head_order():
    from ui.corpus_figures import qk_grid_figure

    rng = np.random.default_rng(1)
    fig = qk_grid_figure([rng.normal(size=(10, 2)) for _ in range(6)], [np.arange(10) % 2 == 1] * 6, 3)
    assert len(fig.data) == 12
    assert [t.name for t in fig.data[::2]] == [f"head {h}" for h in range(6)]
    assert fig.layout.height <= 1000
