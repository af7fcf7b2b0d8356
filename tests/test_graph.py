"""The contribution graph: built backwards above the threshold, the same from a compact trace as from a full one,
from any token of an encoder; and the `graph` verb's JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

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


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_compact_graph_equals_full_graph(tiny_decoders, family):
    from model_core.effects.graph import build_graph

    full, compact = _flows(str(tiny_decoders[family]))
    for threshold in (0.0, 0.04):
        a, b = build_graph(full, -1, threshold), build_graph(compact, -1, threshold)
        assert a.n_edges > 0
        assert [(la, k, s, t) for la, k, s, t in zip(a.layer, a.kind, a.source, a.target)] == \
            [(la, k, s, t) for la, k, s, t in zip(b.layer, b.kind, b.source, b.target)]
        np.testing.assert_allclose(a.weight, b.weight, atol=1e-5)
        np.testing.assert_allclose(a.heads, b.heads, atol=1e-5)


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
