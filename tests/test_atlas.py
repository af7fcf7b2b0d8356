"""The head atlas against brute force: top contexts and profiles from every text's full trace, the QK means from
``model_core.qk``'s per-context splits, the copying score from the plain weights, the ``--show --json`` keys, a
resumed atlas equal to one run at once, and an encoder's card."""

from __future__ import annotations

import json
import numpy as np
import pytest
import torch

from model_core.atlas import SHOW_KEYS, AtlasOptions, AtlasRunError, copying_scores, open_atlas, run_atlas
from model_core.atlas.keys import DECODER_MIN_QUERY
from model_core.atlas.why import explain
from model_core.corpus import Corpus, CorpusModel
from model_core.qk.terms import qk_pass, split_at
from model_core.trace.request import TraceRequest, build_trace
from tiny_models import build_tiny_decoder

TEXTS = (("Time flies like an arrow, and fruit flies like a banana.", None),
         ("The cat sat on the mat and watched the flies. The cat sat on the mat again.", None),
         ("We walked along the river bank in the morning.", None),
         ("A banana and an apple were on the table, next to a cup of tea.", None),
         ("Language models are trained to predict the next token, token by token.", None),
         ("The dog slept by the door.", None))
CORPUS = Corpus("six", TEXTS)
OPTIONS = AtlasOptions(batch_size=4, chunk_size=4, qk_contexts=2)
ENCODER = {"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 48, "seed": 1}


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """A tiny Llama-like decoder, its atlas, and every text's full trace (the brute force reads them)."""
    root = tmp_path_factory.mktemp("atlas")
    folder = build_tiny_decoder("llama", root / "llama")
    model = CorpusModel("pretrained", str(folder))
    loaded = model.load("cpu")
    run = run_atlas(CORPUS, model, root / "run", options=OPTIONS, loaded=loaded)
    traces = [build_trace(TraceRequest("pretrained", a, model_id=str(folder)), device="cpu") for a, _ in TEXTS]
    return {"model": model, "loaded": loaded, "run": run, "traces": traces, "root": root}


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    model = CorpusModel.from_options("custom", **ENCODER)
    loaded = model.load("cpu")
    run = run_atlas(CORPUS, model, tmp_path_factory.mktemp("enc") / "run", options=OPTIONS, loaded=loaded)
    traces = [build_trace(TraceRequest("custom", a, **ENCODER), device="cpu") for a, _ in TEXTS]
    return {"model": model, "loaded": loaded, "run": run, "traces": traces}


def _brute_top(traces, layer, head, decoder, no_sink, k=20):
    """Every text's best (query, key) by a plain loop, ties to the earlier query then key; the top k texts."""
    best = []
    for text_id, trace in enumerate(traces):
        w = trace.weights[layer, head]
        n = w.shape[0]
        found = None
        for q in range(DECODER_MIN_QUERY if decoder else 0, n):
            for key in range(1 if no_sink else 0, q + 1 if decoder else n):
                if found is None or w[q, key] > found[0]:
                    found = (float(w[q, key]), q, key)
        if found is not None:
            best.append((found[0], text_id, found[1], found[2]))
    best.sort(key=lambda t: (-t[0], t[1]))
    return best[:k]


@pytest.mark.parametrize("which", ["decoder", "encoder"])
def test_top_contexts_equal_a_brute_force_scan_of_every_full_trace(which, request):
    atlas = request.getfixturevalue(which)
    run, traces = atlas["run"], atlas["traces"]
    n_layers, n_heads = run.shape
    is_decoder = which == "decoder"
    for text_id, (a, _) in enumerate(TEXTS):  # positions index tokenizer(text).input_ids
        assert list(traces[text_id].token_ids) == atlas["loaded"].tokenizer(a)["input_ids"]
    for layer in range(n_layers):
        for head in range(n_heads):
            card = run.card(layer, head)
            for key, no_sink in (("top_contexts", False), ("top_contexts_no_sink", True)):
                brute = _brute_top(traces, layer, head, is_decoder, no_sink)
                got = card[key]
                assert [(c["text_id"], c["query"], c["key"]) for c in got] == [(t, q, k) for _, t, q, k in brute]
                np.testing.assert_allclose([c["weight"] for c in got], [w for w, *_ in brute], atol=1e-5)
                for c in got:  # the snippet holds both positions with their tokens
                    positions = [p for p, _ in c["snippet"]]
                    assert c["query"] in positions and c["key"] in positions


def _brute_profile(traces, layer, head, punct_ids, special_ids):
    rows = {k: [] for k in ("offset_0", "offset_-1", "offset_-2", "offset_-3", "offset_further", "first_token",
                            "punctuation", "entropy_bits")}
    same, induction = [], []
    for trace in traces:
        w = trace.weights[layer, head].astype(np.float64)
        ids = list(trace.token_ids)
        n = len(ids)
        for q in range(n):
            row = w[q]
            offsets = [row[q - d] if q - d >= 0 else 0.0 for d in range(4)]
            for d in range(4):
                rows[f"offset_-{d}" if d else "offset_0"].append(offsets[d])
            rows["offset_further"].append(row.sum() - sum(offsets))
            rows["first_token"].append(row[0])
            rows["punctuation"].append(sum(row[j] for j in range(n) if ids[j] in punct_ids))
            rows["entropy_bits"].append(-sum(x * np.log2(x) for x in row if x > 0))
            visible = range(q + 1) if trace.causal else range(n)
            if ids[q] not in special_ids:
                dup = [j for j in visible if j != q and ids[j] == ids[q] and ids[j] not in special_ids]
                if dup:
                    same.append(sum(row[j] for j in dup))
                ind = [j for j in range(1, q) if ids[j - 1] == ids[q] and ids[j - 1] not in special_ids]
                if ind:
                    induction.append(sum(row[j] for j in ind))
    out = {k: float(np.mean(v)) for k, v in rows.items()}
    out["same_token"] = float(np.mean(same)) if same else None
    out["induction"] = float(np.mean(induction)) if induction else None
    return out


@pytest.mark.parametrize("which", ["decoder", "encoder"])
def test_profiles_equal_a_direct_computation_from_the_full_traces(which, request):
    atlas = request.getfixturevalue(which)
    classes = atlas["loaded"].classes
    punct_ids, special_ids = set(np.flatnonzero(classes.punct)), set(np.flatnonzero(classes.special))
    run = atlas["run"]
    for layer, head in np.ndindex(*run.shape):
        expected = _brute_profile(atlas["traces"], layer, head, punct_ids, special_ids)
        got = run.card(layer, head)["profile"]
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            if value is None:
                assert got[key] is None, key
            else:
                assert got[key] == pytest.approx(value, abs=1e-6), (layer, head, key)
    assert expected["induction"] is not None  # the corpus has repeats: the induction share is tested


def _qk_reference(loaded, texts, contexts, layer, head):
    """The mean above-the-row-mean split by ``model_core.qk``'s own route: a hooked pass, one split per key."""
    query_sides, key_sides = [], []
    for t, q, k in contexts:
        ids = torch.tensor([texts[t].ids])
        pass_ = qk_pass(loaded.module, ids, layer, head)
        tokens = loaded.tokenizer.convert_ids_to_tokens(texts[t].ids)
        at = split_at(pass_, tokens, q, k, row=True)
        visible = at.row_keys
        key_sides.append(at.row[:, visible.index(k)] - at.row.mean(axis=1))
        per_key = np.stack([split_at(pass_, tokens, q, j).query_side for j in visible])
        query_sides.append(per_key[visible.index(k)] - per_key.mean(axis=0))
        assert at.terms.sum() == pytest.approx(at.score, rel=1e-5, abs=1e-5)  # float64 terms, float32 score
    return np.mean(query_sides, axis=0), np.mean(key_sides, axis=0)


def _encoded(loaded, ids):
    from model_core.corpus.batches import encode_texts

    return {t: encode_texts(loaded.tokenizer, [TEXTS[t]], t, 512, "truncate", loaded.family)[0][0] for t in ids}


@pytest.mark.parametrize("which", ["decoder", "encoder"])
def test_qk_means_equal_the_mean_of_per_context_splits_from_qk(which, request):
    atlas = request.getfixturevalue(which)
    loaded, run = atlas["loaded"], atlas["run"]
    layer, head = run.shape[0] - 1, 1
    contexts = [(c["text_id"], c["query"], c["key"]) for c in run.card(layer, head)["top_contexts_no_sink"][:2]]
    texts = _encoded(loaded, {t for t, _, _ in contexts})
    averages, _ = explain(loaded, texts, {(layer, head): contexts}, effects=False)
    got = averages[(layer, head)]
    query_side, key_side = _qk_reference(loaded, texts, contexts, layer, head)
    np.testing.assert_allclose(got.query_side, query_side, atol=1e-5)
    np.testing.assert_allclose(got.key_side, key_side, atol=1e-5)
    card_qk = run.card(layer, head)["qk"]  # the card names the top 3 of the same means
    top = int(np.argmax(got.key_side))
    assert card_qk["key_side"][0][0] == got.components[top]
    assert card_qk["key_side"][0][1] == pytest.approx(got.key_side[top] / got.key_side.sum(), rel=1e-6)


@pytest.mark.parametrize("family", ["gpt2", "qwen2"])
def test_the_atlas_qk_split_equals_qks_on_layernorm_absolute_positions_and_biases(family, tmp_path):
    """GPT-2 (LayerNorm, learned positions, b_O) and Qwen2 (b_Q, b_K, grouped keys) through the atlas's own split."""
    loaded = CorpusModel("pretrained", str(build_tiny_decoder(family, tmp_path / family))).load("cpu")
    texts = _encoded(loaded, {1, 4})
    contexts = [(1, 14, 3), (4, 9, 9)]
    averages, _ = explain(loaded, texts, {(1, 2): contexts}, effects=False)
    query_side, key_side = _qk_reference(loaded, texts, contexts, 1, 2)
    np.testing.assert_allclose(averages[(1, 2)].query_side, query_side, atol=1e-5)
    np.testing.assert_allclose(averages[(1, 2)].key_side, key_side, atol=1e-5)
    assert averages[(1, 2)].components[-1] == "bias"


def test_the_encoders_one_pass_split_equals_qks_on_post_ln_bert():
    """MiniLM (post-LN: each LayerNorm after its sum, frozen in turn) through the atlas's one hooked pass per text
    (``qk_hooked``), against ``qk``'s split per context and against the per-head pass."""
    loaded = CorpusModel("pretrained", "bundled:all-MiniLM-L6-v2").load("cpu")
    texts = _encoded(loaded, {0, 1})
    contexts = [(0, 5, 2), (1, 9, 3)]
    wanted = {(5, 1): contexts, (3, 7): contexts[:1], (0, 0): contexts[1:]}
    averages, _ = explain(loaded, texts, wanted, effects=False)
    per_head, _ = explain(loaded, texts, wanted, effects=False, fast_qk=False)
    for (layer, head), cs in wanted.items():
        query_side, key_side = _qk_reference(loaded, texts, cs, layer, head)
        got = averages[(layer, head)]
        assert got.components[-1] == "bias" and len(got.components) == len(query_side)
        np.testing.assert_allclose(got.query_side, query_side, atol=1e-5)
        np.testing.assert_allclose(got.key_side, key_side, atol=1e-5)
        np.testing.assert_allclose(got.key_side, per_head[(layer, head)].key_side, atol=1e-6)


def test_the_copying_score_equals_the_plain_weights_computation(decoder):
    model = decoder["loaded"].module
    tokenizer = decoder["loaded"].tokenizer
    got = copying_scores(model, tokenizer)
    specials = set(tokenizer.all_special_ids)
    ids = [i for i in range(model.config.vocab_size) if i not in specials]
    d = lambda t: t.detach().double().numpy()  # noqa: E731
    w_e, w_u = d(model.model.embed_tokens.weight)[ids], d(model.lm_head.weight)[ids] * d(model.model.norm.weight)
    n_heads = model.config.num_attention_heads
    d_head = model.config.hidden_size // n_heads
    group = n_heads // model.config.num_key_value_heads
    for layer, head in ((0, 0), (1, 3)):  # two heads (a (vocab, vocab) eigendecomposition each), two kv heads
        block = model.model.layers[layer]
        g = d(block.input_layernorm.weight)
        w_v, w_o = d(block.self_attn.v_proj.weight), d(block.self_attn.o_proj.weight)
        kv = head // group
        ov = (g[:, None] * w_v[kv * d_head:(kv + 1) * d_head].T) @ w_o[:, head * d_head:(head + 1) * d_head].T
        full = w_e @ ov @ w_u.T  # (vocab, vocab): the whole OV circuit, no factorisation
        eig = np.linalg.eigvals(full)
        assert got[layer, head] == pytest.approx(eig.sum().real / np.abs(eig).sum(), abs=1e-5)
    assert decoder["run"].card(0, 0)["copying_score"] == pytest.approx(float(got[0, 0]))


def test_show_json_prints_exactly_the_issues_keys(decoder, capsys):
    from model_core.cli.main import main

    assert main(["atlas", "--show", str(decoder["run"].path), "--head", "1.2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == list(SHOW_KEYS) == ["layer", "head", "summary", "top_contexts", "top_contexts_no_sink",
                                            "deciles", "profile", "qk", "copying_score", "promoted_tokens", "roles",
                                            "composition"]
    assert (out["layer"], out["head"]) == (1, 2)
    assert all(list(c) == ["text_id", "query", "key", "weight", "snippet"] for c in out["top_contexts"])
    assert list(out["qk"]) == ["query_side", "key_side"] and len(out["qk"]["key_side"]) == 3
    assert all(isinstance(t, str) and isinstance(e, float) for t, e in out["promoted_tokens"])
    assert main(["atlas", "--show", str(decoder["run"].path), "--head", "9.0", "--json"]) == 1
    assert "layers 0..1" in capsys.readouterr().err


def test_a_card_opens_from_its_own_file_and_an_atlas_without_them_still_opens(decoder, tmp_path):
    import shutil

    from model_core.atlas.store import card_path

    folder = decoder["run"].path
    everything = json.loads((folder / "heads.json").read_text(encoding="utf-8"))["heads"]
    assert card_path(folder, 1, 2).is_file()
    fresh = open_atlas(folder)
    assert fresh.card(1, 2) == everything[1 * fresh.shape[1] + 2]
    assert fresh._heads is None  # heads.json was not read for one card
    older = tmp_path / "older"  # an atlas written before the per-head files
    shutil.copytree(folder, older)
    shutil.rmtree(older / "cards")
    assert open_atlas(older).card(1, 2) == fresh.card(1, 2)


def test_an_atlas_over_the_memory_limit_is_refused_before_its_first_pass(decoder, tmp_path, monkeypatch, capsys):
    from model_core.cli.main import main
    from model_core.models.run_memory import RunMemoryError

    monkeypatch.setenv("AE_RUN_MEMORY_MB", "50")
    with pytest.raises(RunMemoryError, match=r"An atlas of texts up to 128 tokens would need about [\d,]+ MB.*"
                                             r"limit of 50 MB.*Lower --max-tokens"):
        run_atlas(CORPUS, decoder["model"], tmp_path / "a", options=AtlasOptions(), loaded=decoder["loaded"])
    assert not (tmp_path / "a" / "parts").exists()
    folder = str(decoder["root"] / "llama")
    args = ["atlas", "--model", "pretrained", "--model-id", folder, "--corpus", "demo", "--limit", "3", "--quiet",
            "--out", str(tmp_path / "b")]
    assert main([*args, "--run-memory-mb", "60"]) == 1  # the flag is the command's limit
    assert "limit of 60 MB" in capsys.readouterr().err
    monkeypatch.delenv("AE_RUN_MEMORY_MB")
    assert main([*args, "--max-tokens", "64"]) == 0 and open_atlas(tmp_path / "b").complete


def test_a_stopped_atlas_keeps_its_shards_and_a_rerun_continues_to_the_same_cards(decoder, tmp_path):
    class Stop(Exception):
        pass

    def stop_after_first_shard(p):  # a Stop in the second shard's batch: the first shard is on disk
        if p.stage == "scan" and p.done > OPTIONS.chunk_size:
            raise Stop

    with pytest.raises(Stop):
        run_atlas(CORPUS, decoder["model"], tmp_path / "a", options=OPTIONS, loaded=decoder["loaded"],
                  progress=stop_after_first_shard)
    partial = open_atlas(tmp_path / "a")
    assert not partial.complete and len(list((tmp_path / "a" / "parts").glob("*.npz"))) == 1
    with pytest.raises(AtlasRunError, match="partial atlas"):
        partial.card(0, 0)
    seen = []
    resumed = run_atlas(CORPUS, decoder["model"], tmp_path / "a", options=OPTIONS, loaded=decoder["loaded"],
                        progress=lambda p: seen.append(p))
    assert resumed.complete
    assert min(p.done for p in seen if p.stage == "scan") > OPTIONS.chunk_size  # the first shard was not rerun
    assert resumed.heads == decoder["run"].heads
    other = CorpusModel.from_options("custom", **ENCODER)
    with pytest.raises(AtlasRunError, match="another --out folder"):
        run_atlas(CORPUS, other, tmp_path / "a", options=OPTIONS)


def test_an_encoder_card_says_it_writes_no_logits_and_still_explains_its_scores(encoder):
    card = encoder["run"].card(1, 0)
    assert card["copying_score"] is None and card["promoted_tokens"] is None
    assert card["qk"] is not None and card["summary"]
    assert card["roles"]["induction"] is not None
    assert set(card["composition"]) == {"q", "k", "v"}


@pytest.mark.slow
def test_the_ray_engine_equals_the_local_one(decoder, tmp_path):
    ray = pytest.importorskip("ray")
    try:
        remote = run_atlas(CORPUS, decoder["model"], tmp_path / "ray", options=OPTIONS, loaded=decoder["loaded"],
                           engine="ray", ray_num_cpus=1)
    finally:
        ray.shutdown()
    assert remote.manifest["engine"] == "ray"
    local = decoder["run"]
    for layer, head in np.ndindex(*local.shape):
        a, b = remote.card(layer, head), local.card(layer, head)
        for key in ("top_contexts", "top_contexts_no_sink"):
            assert [(c["text_id"], c["query"], c["key"]) for c in a[key]] == \
                [(c["text_id"], c["query"], c["key"]) for c in b[key]]
            np.testing.assert_allclose([c["weight"] for c in a[key]], [c["weight"] for c in b[key]], atol=1e-6)
        for key, value in b["profile"].items():
            assert a["profile"][key] == pytest.approx(value, abs=1e-6)


def test_the_summary_names_an_induction_head_by_its_circuit_only_when_a_previous_token_head_drives_its_keys():
    from model_core.atlas.summary import summarise

    sink = {"offset_-1": 0.1, "first_token": 0.95, "induction": 0.02}
    assert summarise(sink, [["L2H0", 0.8]], previous_heads=frozenset({"L2H0"}))[0] == "induction"
    assert summarise(sink, [["L2H0", 0.3]], previous_heads=frozenset({"L2H0"}))[0] == "sink"  # a weak drive
    assert summarise(sink, [["L2H1", 0.8]], previous_heads=frozenset({"L2H0"}))[0] == "sink"  # not a prev-token head
    kind, line = summarise({"offset_-1": 0.91}, [["embed", 0.7]])
    assert kind == "previous-token" and line.startswith("previous-token head: 0.91 of its weight one token back")


def test_a_context_is_drawn_with_its_tokens_escaped_and_the_query_and_key_marked():
    from attention_explorer.atlas import context_html

    out = context_html({"text_id": 0, "query": 3, "key": 1, "weight": 0.5,
                        "snippet": [[0, "a"], [1, "<script>"], [2, " & "], [3, "q"], [9, "far"]]})
    assert "<script>" not in out and "&lt;script&gt;" in out and "&amp;" in out
    assert 'title="key 1"' in out and 'title="query 3"' in out and " … " in out  # a gap between positions 3 and 9


def test_a_long_text_through_the_compact_pass_scans_as_the_batched_pass_does(decoder, monkeypatch):
    """Texts from ``LONG_FROM`` tokens are scanned alone through the compact pass, layer by layer in blocks of query
    rows: with the threshold lowered to every text and blocks of 3 rows, the same best pairs, weights within 1e-5
    and the same profile sums as the batched eager pass."""
    import model_core.atlas.shard as shard

    loaded = decoder["loaded"]
    batched = shard.process_shard(loaded, 0, 0, list(TEXTS), batch_size=4)
    monkeypatch.setattr(shard, "LONG_FROM", 1)
    monkeypatch.setattr(shard, "QUERY_BLOCK", 3)
    long = shard.process_shard(loaded, 0, 0, list(TEXTS), batch_size=4)
    np.testing.assert_array_equal(long.best_q, batched.best_q)
    np.testing.assert_array_equal(long.best_k, batched.best_k)
    np.testing.assert_allclose(long.best_w, batched.best_w, atol=1e-5)
    np.testing.assert_allclose(long.sums, batched.sums, atol=1e-4, rtol=1e-5)
    np.testing.assert_array_equal(long.rows, batched.rows)
