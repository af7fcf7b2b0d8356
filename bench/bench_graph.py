"""The contribution graph (SmolLM2-135M) against the issue's targets: the graph from the last token at 512 tokens
against the full trace, at 4,096 tokens against the compact trace (with peak RSS), every node's contributions at 512
tokens, and a threshold change.

Each size runs in a child process of its own (peak RSS is the child's). The text is the team-written field notes of
bench/bench_compact.py. Usage: python bench/bench_graph.py [--sizes 512 4096] [--skip-every-node]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

THRESHOLD = 0.04


def _request(n: int):
    from bench_compact import long_text

    from model_core.models.bundled import ensure_bundled_decoder
    from model_core.models.loading import load_pretrained
    from model_core.settings import BUNDLED_DECODER_ID
    from model_core.trace.request import TraceRequest

    ensure_bundled_decoder()
    loaded = load_pretrained(BUNDLED_DECODER_ID, device="cpu")
    ids = loaded.tokenizer(long_text(n), add_special_tokens=False)["input_ids"]
    text = loaded.tokenizer.decode(ids[: n - 1])  # the tokenizer's BOS makes n
    return loaded, TraceRequest("pretrained", text, model_id=BUNDLED_DECODER_ID, truncate=True)


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def child_full(n: int, every_node: bool) -> dict:
    from model_core.effects.graph import build_graph, prefetch
    from model_core.effects.graph_source import trace_flow
    from model_core.trace.request import build_trace

    loaded, request = _request(n)
    build_trace(request, device="cpu")  # warm: the first pass pays for allocations
    trace, t_trace = _timed(lambda: build_trace(request, device="cpu"))
    graph, t_graph = _timed(lambda: build_graph(trace_flow(trace, loaded.model, loaded.family), -1, THRESHOLD))
    flow = trace_flow(trace, loaded.model, loaded.family)
    build_graph(flow, -1, THRESHOLD)
    _, t_prefetch = _timed(lambda: prefetch(flow, -1, THRESHOLD))  # the page runs it in a background thread
    changes = [_timed(lambda t=t: build_graph(flow, -1, t))[1] for t in (0.05, THRESHOLD, 0.03, 0.02)]
    out = {"tokens": trace.n_tokens, "trace_s": t_trace, "graph_s": t_graph, "nodes": len(graph.nodes()),
           "edges": graph.n_edges, "threshold_change_s": changes, "prefetch_s": t_prefetch}
    if every_node:
        _, out["every_node_s"] = _timed(lambda: flow.every_layer())
    return out


def child_compact(n: int) -> dict:
    from model_core.compact.build import build_compact
    from model_core.effects.graph import build_graph
    from model_core.effects.graph_source import compact_flow

    loaded, request = _request(n)
    ct, t_compact = _timed(lambda: build_compact(request, device="cpu", predictions=False, largest_weight=False,
                                                 max_tokens=n))
    graph, t_graph = _timed(lambda: build_graph(compact_flow(ct, loaded.model, loaded.family), -1, THRESHOLD))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # kB -> MB
    return {"tokens": ct.n_tokens, "compact_s": t_compact, "graph_s": t_graph, "nodes": len(graph.nodes()),
            "edges": graph.n_edges, "peak_rss_mb": peak}


def _run(args: list[str]) -> dict:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[512, 4096])
    parser.add_argument("--skip-every-node", action="store_true")
    parser.add_argument("--child", choices=["full", "compact"])
    parser.add_argument("--n", type=int)
    args = parser.parse_args()
    if args.child:
        out = child_full(args.n, not args.skip_every_node) if args.child == "full" else child_compact(args.n)
        print(json.dumps(out))
        return
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; SmolLM2-135M; threshold {THRESHOLD}")
    for n in args.sizes:
        if n <= 512:
            r = _run(["--child", "full", "--n", str(n)] + (["--skip-every-node"] if args.skip_every_node else []))
            print(f"{r['tokens']} tokens: full trace {r['trace_s']:.2f} s, graph from the last token "
                  f"{r['graph_s']:.2f} s ({r['nodes']} nodes, {r['edges']} edges): "
                  f"ratio {r['graph_s'] / r['trace_s']:.2f} (target <= 2)")
            print(f"  threshold change: {', '.join(f'{t:.3f}' for t in r['threshold_change_s'])} s (0.05, 0.04, "
                  f"0.03, 0.02 after the background prefetch of threshold/2, {r['prefetch_s']:.1f} s; target <= 0.5)")
            if "every_node_s" in r:
                print(f"  every node's contributions: {r['every_node_s']:.1f} s (target <= 30)")
        else:
            r = _run(["--child", "compact", "--n", str(n)])
            print(f"{r['tokens']} tokens: compact trace {r['compact_s']:.2f} s, graph {r['graph_s']:.2f} s "
                  f"({r['nodes']} nodes, {r['edges']} edges): ratio {r['graph_s'] / r['compact_s']:.2f} "
                  f"(target <= 1.5); peak RSS {r['peak_rss_mb']:,.0f} MB (target <= 3,000)")


if __name__ == "__main__":
    main()
