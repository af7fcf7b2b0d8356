"""The ``graph`` verb: ``python -m model_core graph --model pretrained --model-id ID --text TEXT [--threshold T]
[--token I] --json``: every node's contributions (Ferrando & Voita 2024) and the contribution graph of one token."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from model_core.cli.compact import read_text
from model_core.cli.options import (
    MODEL_CHOICES,
    add_encoder_shape_options,
    custom_options_misused,
)

MAX_FLOATS = 5_000_000
"""Past this many floats (tokens² × heads × layers) the n × n matrices are left out of the JSON."""


def add_graph_parser(sub: Any) -> None:
    """Add the ``graph`` verb to the command line's subparsers."""
    g = sub.add_parser(
        "graph", help="contributions of every attention term and MLP to each residual vector, and the contribution "
                      "graph of one token (information flow routes)",
        description="Prints every node's contributions after the renormalising threshold: per layer the n x n "
                    "matrices 'attention' [to][from] (summed over heads) and 'attention_heads' [to][from][head], "
                    "and 'attention_residual', 'ffn', 'ffn_residual' per token. The n x n matrices are left out "
                    f"when tokens² x heads x layers passes --max-floats (default {MAX_FLOATS:,}); the JSON says so "
                    "in 'matrices' and 'note'. Past a full trace's size (AE_FULL_TRACE_MB) the text is traced in "
                    "compact form: the graph of --token is printed, and the per-token vectors only at the nodes "
                    "it reached (null elsewhere).")
    g.add_argument("--model", choices=MODEL_CHOICES, required=True,
                   help="pretrained: a transformers model of any supported family; custom: the chapter-3 encoder")
    g.add_argument("--model-id", default=None, help="hub id, folder, or a bundled id (default: the bundled BERT)")
    g.add_argument("--text", default=None, help="the text (or --text-file)")
    g.add_argument("--text-file", default=None, help="read the text from this UTF-8 file")
    g.add_argument("--text-b", default=None, help="optional sentence B")
    g.add_argument("--truncate", action="store_true", help="keep the first tokens of a text over the limit")
    g.add_argument("--threshold", type=float, default=0.04, help="renormalising threshold in [0.01, 1) (default 0.04); below 0.01 every share passes")
    g.add_argument("--token", type=int, default=-1,
                   help="the position the graph starts from (default -1: the last token, a decoder's prediction)")
    g.add_argument("--max-floats", type=int, default=MAX_FLOATS, help="leave the n x n matrices out past this size")
    g.add_argument("--weights", choices=["random", "pretrained"], default="random", help="custom encoder only")
    g.add_argument("--seed", type=int, default=0, help="custom encoder only")
    g.add_argument("--causal", action="store_true", help="custom encoder only: apply the causal mask")
    g.add_argument("--norm", choices=["pre", "post"], default="pre", help="custom encoder with random weights only")
    add_encoder_shape_options(g)
    g.add_argument("--device", default=None, help="auto, cpu, cuda or mps")
    g.add_argument("--json", action="store_true", help="print JSON")


def _progress(label: str):
    last = {"tenth": -1}

    def report(done: float) -> None:
        if int(done * 10) != last["tenth"]:
            last["tenth"] = int(done * 10)
            print(f"{label}: {done:4.0%}", file=sys.stderr, flush=True)
    return report


def run_graph(args: argparse.Namespace, text: str) -> dict[str, Any]:
    """Trace the text (full, or compact past a full trace's size), then every node's contributions and the graph.

    Raises:
        ValueError: bad input (InputError, ModelLoadError, an option out of range).
    """
    # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
    from model_core.compact.build import build_compact, trace_form
    from model_core.effects.graph import build_graph, check_threshold
    from model_core.effects.graph_source import compact_flow, trace_flow
    from model_core.trace.request import TraceRequest, build_trace
    from model_core.trace.resolve import resolve

    check_threshold(args.threshold)
    request = TraceRequest(args.model, text, args.text_b or "", model_id=args.model_id, weights=args.weights,
                           seed=args.seed, causal=args.causal, norm_placement=args.norm,
                           num_hidden_layers=args.layers, num_attention_heads=args.heads, hidden_size=args.hidden,
                           truncate=args.truncate)
    resolved = resolve(request, device=args.device)
    if trace_form(request, device=args.device).compact:
        trace = build_compact(request, device=args.device, predictions=False, largest_weight=False)
        flow = compact_flow(trace, resolved.model, resolved.family)
    else:
        trace = build_trace(request, device=args.device)
        flow = trace_flow(trace, resolved.model, resolved.family)
    graph = build_graph(flow, args.token, args.threshold)
    out: dict[str, Any] = {"tokens": list(flow.tokens), "token": graph.token, "threshold": args.threshold,
                           "n_layers": flow.n_layers, "n_heads": flow.n_heads}
    if hasattr(trace, "lse"):
        out |= {"layers": reached_layers(flow, graph), "matrices": False,
                "note": f"{flow.n_tokens} tokens are traced in compact form: 'attention_residual', 'ffn' and "
                        "'ffn_residual' are given at the nodes the graph of --token reached (null elsewhere); the "
                        "n x n matrices are left out."}
    else:
        size = flow.n_tokens ** 2 * flow.n_heads * flow.n_layers
        full = size <= args.max_floats
        layers = flow.every_layer(_progress("contributions"))
        out |= {"layers": [layer.thresholded(args.threshold).to_json(full) for layer in layers], "matrices": full}
        if not full:
            out["note"] = (f"tokens² x heads x layers = {size:,} floats passes --max-floats {args.max_floats:,}: "
                           "'attention' and 'attention_heads' are left out.")
    return out | {"graph": graph.to_json()}


def reached_layers(flow: Any, graph: Any) -> list[dict[str, list[float | None]]]:
    """Per layer, the thresholded per-token vectors 'attention_residual' (at the graph's resid_mid nodes), 'ffn' and
    'ffn_residual' (at its resid_post nodes), None at the nodes the graph did not reach (a compact trace's JSON)."""
    # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
    from model_core.effects.contributions import renormalise

    nodes = graph.nodes()
    out = []
    for layer in range(flow.n_layers):
        record: dict[str, list[float | None]] = {k: [None] * flow.n_tokens
                                                 for k in ("attention_residual", "ffn", "ffn_residual")}
        mids = [p for s, p in nodes if s == 2 * layer + 1]
        for p, (terms, res) in zip(mids, flow.attention(layer, mids)):
            record["attention_residual"][p] = float(renormalise(terms[None], np.array([res]), graph.threshold)[1][0])
        posts = [p for s, p in nodes if s == 2 * layer + 2]
        for p, (ffn, res) in zip(posts, flow.mlp(layer, posts)):
            kept, kept_res = renormalise(np.array([[ffn]]), np.array([res]), graph.threshold)
            record["ffn"][p], record["ffn_residual"][p] = float(kept[0, 0]), float(kept_res[0])
        out.append(record)
    return out


def graph_main(args: argparse.Namespace) -> int:
    """The ``graph`` verb: JSON (``--json``) or the graph's strongest edges, one a line."""
    text = read_text(args)
    if text is None:
        return 2
    if custom_options_misused(args):
        return 2
    try:
        out = run_graph(args, text)
    except (ValueError, OSError) as exc:  # InputError and ModelLoadError are ValueErrors
        print(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out))
        return 0
    graph = out["graph"]
    tokens = out["tokens"]
    print(f"{len(tokens)} tokens; graph of token {graph['token']} ({tokens[graph['token']]!r}) at threshold "
          f"{out['threshold']}: {len(graph['nodes'])} nodes, {len(graph['edges'])} edges")
    for edge in sorted(graph["edges"], key=lambda e: -e["weight"])[:20]:
        print(f"  layer {edge['layer']:>2} {edge['kind']:<18} {tokens[edge['from']]!r} -> {tokens[edge['to']]!r}: "
              f"{edge['weight']:.3f}")
    return 0
