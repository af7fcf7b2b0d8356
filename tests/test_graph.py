"""The contribution graph: built backwards above the threshold, the same from a compact trace as from a full one,
from any token of an encoder; and the `graph` verb's JSON."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

TEXT = "time flies like an arrow and fruit flies like a banana"


def _flows(folder: str):
    from model_core import TraceRequest, build_trace
    from model_core.compact.build import build_compact
    from model_core.effects.graph_source import compact_flow, trace_flow
    from model_core.models.loading import load_pretrained

    request = TraceRequest("pretrained", TEXT, model_id=folder)
    loaded = load_pretrained(folder, device="cpu")
    full = trace_flow(build_trace(request, device="cpu"), loaded.model, loaded.family)
    compact = compact_flow(build_compact(request, device="cpu", predictions=False), loaded.model, loaded.family)
    return full, compact


def _assert_same_graphs(full, compact, heads: bool = False) -> None:
    """The graphs from the last token, at two thresholds, are the same edges with the same weights (and per-head
    splits) from the full and the compact flow."""
    from model_core.effects.graph import build_graph

    for threshold in (0.01, 0.04):
        a, b = build_graph(full, -1, threshold), build_graph(compact, -1, threshold)
        assert a.n_edges > 0
        assert list(zip(a.layer, a.kind, a.source, a.target)) == list(zip(b.layer, b.kind, b.source, b.target))
        np.testing.assert_allclose(a.weight, b.weight, atol=1e-5)
        if heads:
            np.testing.assert_allclose(a.heads, b.heads, atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_compact_graph_equals_full_graph(tiny_decoders, family):

    _assert_same_graphs(*_flows(str(tiny_decoders[family])), heads=True)


def test_graph_keeps_only_edges_above_the_threshold(tiny_decoders):
    from model_core.effects.graph import build_graph

    full, _ = _flows(str(tiny_decoders["llama"]))
    graph = build_graph(full, -1, 0.1)
    assert np.all(graph.weight > 0.1)
    nodes = set(graph.nodes())
    src, dst = graph.edge_stages()
    assert (2 * full.n_layers, full.n_tokens - 1) in nodes
    for s, p in zip(src.tolist(), graph.source.tolist()):  # every source below the top is reached from above
        assert s == 0 or any(d == s and t == p for d, t in zip(dst.tolist(), graph.target.tolist()))
    attention = graph.kind == "attention"
    np.testing.assert_allclose(graph.heads[attention].sum(1), graph.weight[attention], atol=1e-6)
    lower = build_graph(full, -1, 0.02)
    assert len(lower.nodes()) >= len(graph.nodes())


def test_a_threshold_above_every_share_gives_no_edges_and_no_nan(tiny_decoders):
    from model_core.effects.graph import build_graph

    full, _ = _flows(str(tiny_decoders["gpt2"]))
    graph = build_graph(full, 0, 0.999)
    assert graph.n_edges == 0 and graph.nodes() == [(2 * full.n_layers, 0)]
    layer = full.layer(0).thresholded(0.999)
    assert not np.isnan(layer.attention_heads).any() and not np.isnan(layer.ffn).any()


def test_an_encoder_graph_starts_from_any_token(bundled):
    from model_core import TraceRequest, build_trace
    from model_core.effects.graph import build_graph
    from model_core.effects.graph_source import trace_flow

    trace = build_trace(TraceRequest("pretrained", "The bank of the river."), device="cpu")
    flow = trace_flow(trace, bundled.model, bundled.family)
    for token in (0, 3):
        graph = build_graph(flow, token, 0.04)
        assert graph.token == token and graph.n_edges > 0
        assert set(graph.target[graph.layer == flow.n_layers - 1].tolist()) == {token}
    with pytest.raises(ValueError, match="out of range"):
        build_graph(flow, 99, 0.04)


def test_graph_json_and_csv_rows(tiny_decoders):
    from model_core.effects.graph import build_graph

    full, _ = _flows(str(tiny_decoders["llama"]))
    graph = build_graph(full, -1, 0.04)
    data = json.loads(graph.dumps())
    assert len(data["edges"]) == graph.n_edges and data["token"] == full.n_tokens - 1
    rows = graph.edge_rows()
    assert {"layer", "kind", "from", "to", "weight", "head_0"} <= set(rows[0])


def test_graph_cli_prints_every_nodes_contributions(tiny_decoders, capsys):
    from model_core.cli.main import main

    folder = str(tiny_decoders["llama"])
    assert main(["graph", "--model", "pretrained", "--model-id", folder, "--text", TEXT, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    n, layers = len(out["tokens"]), out["layers"]
    assert out["matrices"] is True and len(layers) == out["n_layers"]
    heads = np.array(layers[0]["attention_heads"])
    assert heads.shape == (n, n, out["n_heads"])
    np.testing.assert_allclose(np.array(layers[0]["attention"]), heads.sum(-1), atol=1e-6)
    total = heads.sum((1, 2)) + np.array(layers[0]["attention_residual"])
    assert np.all((np.abs(total - 1) < 1e-5) | (total == 0))  # renormalised survivors, or nothing above
    assert main(["graph", "--model", "pretrained", "--model-id", folder, "--text", TEXT, "--json",
                 "--max-floats", "10"]) == 0
    small = json.loads(capsys.readouterr().out)
    assert small["matrices"] is False and "attention_heads" not in small["layers"][0] and "note" in small


def test_graph_cli_rejects_bad_input(tiny_decoders, capsys):
    from model_core.cli.main import main

    folder = str(tiny_decoders["llama"])
    assert main(["graph", "--model", "pretrained", "--model-id", folder, "--text", TEXT, "--threshold", "1.5"]) == 1
    assert "threshold" in capsys.readouterr().err
    assert main(["graph", "--model", "pretrained", "--model-id", folder, "--text", TEXT, "--token", "500"]) == 1
    assert "out of range" in capsys.readouterr().err


def test_notebook_functions_return_arrays_and_figures(tiny_decoders):
    from attention_explorer.contributions import contributions, graph, head_maps_figure
    from model_core import TraceRequest, build_trace
    from model_core.models.loading import load_pretrained

    folder = str(tiny_decoders["qwen2"])
    trace = build_trace(TraceRequest("pretrained", TEXT, model_id=folder), device="cpu")
    loaded = load_pretrained(folder, device="cpu")
    layers = contributions(trace, loaded.model, loaded.family, threshold=0.04)
    assert len(layers) == trace.n_layers and layers[0].attention_heads.shape == (trace.n_tokens,) * 2 + (trace.n_heads,)
    built, fig = graph(trace, loaded.model, loaded.family, -1, 0.04)
    assert built.n_edges > 0 and fig.layout.title.text.startswith("Contribution graph of")
    assert any(t.name == "node" for t in fig.data)
    rows = built.positions(trace.n_layers - 1)
    contrib = layers[-1].attention_heads[rows].transpose(0, 2, 1)
    maps = head_maps_figure(contrib, trace.weights[-1][:, rows].transpose(1, 0, 2), rows, trace.labels,
                            trace.n_layers - 1)
    assert len(maps.data) == 2 * trace.n_heads and all(t.coloraxis == "coloraxis" for t in maps.data)
    assert (maps.layout.coloraxis.cmin, maps.layout.coloraxis.cmax) == (0.0, 1.0)


# -- review fixes: sliding windows, the lowest threshold, bounded memory, prefetch, the compact CLI, the figure -----
@pytest.fixture(scope="module")
def sliding(tmp_path_factory):
    """Tiny Mistral and Gemma 3 whose sliding window (4) is shorter than the text: the mask is not plain causal."""
    from tiny_models import build_tiny_decoder

    folders = {}
    for family in ("mistral", "gemma3_text"):
        folder = build_tiny_decoder(family, tmp_path_factory.mktemp(f"graph-sliding-{family}"))
        config = json.loads((folder / "config.json").read_text())
        config["sliding_window"] = 4
        (folder / "config.json").write_text(json.dumps(config))
        folders[family] = str(folder)
    return folders


@pytest.mark.parametrize("family", ["mistral", "gemma3_text"])
def test_sliding_window_compact_graph_equals_full_graph(sliding, family):

    full, compact = _flows(sliding[family])
    assert not compact.source.compact.masks[0][-1, 0]  # the window is shorter than the text
    _assert_same_graphs(full, compact)


def test_compact_rows_are_zero_at_masked_keys_whatever_their_score(sliding):
    from model_core.effects.graph_source import CompactSource

    _, compact = _flows(sliding["mistral"])
    ct = compact.source.compact
    huge = dataclasses.replace(ct, score_scale=ct.score_scale * 1e5)  # masked scores far past exp's range
    source = CompactSource(huge, compact.blocks, compact.source.hidden)
    n = ct.n_tokens
    rows = source.rows(0, np.arange(n), n)
    allowed = ct.masks[ct.mask_of_layer[0]]
    assert not torch.isnan(rows).any()
    assert (rows.numpy().transpose(0, 2, 1)[~allowed] == 0).all()


def test_a_threshold_below_the_lowest_is_refused(tiny_decoders, capsys):
    from model_core.cli.main import main
    from model_core.effects.graph import MIN_THRESHOLD, build_graph

    full, _ = _flows(str(tiny_decoders["llama"]))
    for threshold in (0.0, MIN_THRESHOLD / 2):
        with pytest.raises(ValueError, match="0.01"):
            build_graph(full, -1, threshold)
    assert full.kept_bytes == 0  # refused before any node was computed
    folder = str(tiny_decoders["llama"])
    assert main(["graph", "--model", "pretrained", "--model-id", folder, "--text", TEXT, "--threshold", "0"]) == 1
    assert "0.01" in capsys.readouterr().err


def test_kept_nodes_stay_under_the_byte_bound_and_give_the_same_graph(tiny_decoders):
    from model_core.effects.graph import build_graph
    from model_core.effects.graph_flow import ContributionFlow

    full, _ = _flows(str(tiny_decoders["llama"]))
    a = build_graph(full, -1, 0.01)
    bound = full.kept_bytes // 3
    small = ContributionFlow(full.source, full.blocks, max_kept_bytes=bound)
    b = build_graph(small, -1, 0.01)
    assert 0 < small.kept_bytes <= bound
    assert small.nbytes >= small.max_kept_bytes  # a cache measuring the flow once sees its bound
    np.testing.assert_array_equal(a.source, b.source)
    np.testing.assert_allclose(a.weight, b.weight, atol=1e-6)


def test_a_stopped_walk_computes_nothing_and_the_prefetcher_keeps_the_newest(tiny_decoders):
    from model_core.effects.graph import Prefetcher, build_graph
    from model_core.effects.graph_flow import Superseded

    full, _ = _flows(str(tiny_decoders["llama"]))
    with pytest.raises(Superseded):
        build_graph(full, -1, 0.04, stop=lambda: True)
    assert full.kept_bytes == 0
    prefetcher = Prefetcher(full)
    prefetcher.request(-1, 0.3)
    prefetcher.request(-1, 0.08)  # supersedes the first if it still runs
    prefetcher.join(60)
    assert (-1, 0.08) in prefetcher.done
    kept = full.kept_bytes
    build_graph(full, -1, 0.04)  # 0.08 × 0.5: every node was prefetched
    assert full.kept_bytes == kept
    prefetcher.request(-1, 0.08)
    assert prefetcher._thread is None  # done already: no new thread


def test_graph_cli_prints_reached_nodes_of_a_compact_trace(tiny_decoders, capsys, monkeypatch):
    from model_core.cli.main import main

    monkeypatch.setenv("AE_FULL_TRACE_MB", "0.01")  # about 50 tokens of a tiny decoder are traced compact
    folder = str(tiny_decoders["llama"])
    text = " ".join([TEXT] * 4)
    assert main(["graph", "--model", "pretrained", "--model-id", folder, "--text", text, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["matrices"] is False and len(out["layers"]) == out["n_layers"] and "compact" in out["note"]
    top = out["layers"][-1]
    last = len(out["tokens"]) - 1
    assert top["ffn"][last] is not None and top["ffn_residual"][last] is not None
    assert top["ffn"][last] + top["ffn_residual"][last] == pytest.approx(1.0, abs=1e-5)
    reached = {(n["stage"], n["position"]) for n in out["graph"]["nodes"]}
    for layer, record in enumerate(out["layers"]):
        for p, value in enumerate(record["attention_residual"]):
            assert (value is not None) == ((2 * layer + 1, p) in reached)


def test_graph_figure_places_token_columns_evenly(tiny_decoders):
    from attention_explorer.contributions import graph_figure
    from model_core.effects.graph import build_graph

    full, _ = _flows(str(tiny_decoders["llama"]))
    graph = build_graph(full, -1, 0.1)
    fig = graph_figure(graph, full.tokens)
    positions = sorted({p for _, p in graph.nodes()})
    assert list(fig.layout.xaxis.tickvals) == list(range(len(positions)))
    assert [t.split(" ·")[-1] for t in fig.layout.xaxis.ticktext] == [str(p) for p in positions]
    node = next(t for t in fig.data if t.name == "node")
    assert set(np.asarray(node.x).tolist()) == set(range(len(positions)))


def test_model_modules_run_under_the_routes_gate(tiny_decoders):
    from model_core.effects.graph_tokens import block_tokens
    from model_core.models.loading import load_pretrained
    from model_core.gate import GATE

    folder = str(tiny_decoders["llama"])
    _, compact = _flows(folder)
    loaded = load_pretrained(folder, device="cpu")
    model = compact.blocks.model
    held = []
    assert not GATE.held_here  # the control: this thread holds no turn between passes
    record = lambda *_: held.append(GATE.held_here)  # noqa: E731
    hooks = [model.model.layers[0].self_attn.v_proj.register_forward_hook(record),
             model.model.norm.register_forward_pre_hook(record)]
    try:
        compact.blocks.values(0, compact.source.hidden[0])  # a compact trace's values: v_proj over every position
        block_tokens(compact, model, compact.blocks.family, loaded.tokenizer, 0, 3)  # the final norm, frozen
    finally:
        for hook in hooks:
            hook.remove()
    assert len(held) >= 2 and all(held), held  # v_proj, and the final norm (at least once)
