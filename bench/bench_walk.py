"""Benchmark the block walk of "Inside the model" on the bundled decoder: one walk per layer against the trace.

Run: ``.venv/bin/python bench/bench_walk.py [--sizes 128 512] [--layers 0 15 29] [--repeat 3]``

For each size it builds the trace of a team-written text (tokenise + forward pass + the AttentionTrace), then walks
each chosen layer (``model_core.walk.build.build_walkthrough``: the pass stops after the walked block, and the next
token comes from the trace's last block output). It prints the median seconds of each, the walk's ratio to the
trace, the walk's size in memory, and the process's peak RSS.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def median_seconds(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--layers", type=int, nargs="+", default=[0, 15, 29])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    import torch

    from bench_compact_page import prompt
    from model_core import TraceRequest, build_trace
    from model_core.walk.build import build_walkthrough
    from model_core.settings import BUNDLED_DECODER_ID
    from model_core.trace.shape import arrays_nbytes
    from ui.loaders import cpu_threads  # the server's number of torch threads

    torch.set_num_threads(cpu_threads())
    print(f"torch threads {torch.get_num_threads()}; medians of {args.repeat}")
    build_trace(TraceRequest(model="pretrained", model_id=BUNDLED_DECODER_ID, text_a="warm up"))  # loads the model
    print("| tokens | trace | layer | walk | walk × trace | walk in memory | peak RSS |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.sizes:
        request = TraceRequest(model="pretrained", model_id=BUNDLED_DECODER_ID, text_a=prompt(n))
        trace_s, trace = median_seconds(lambda: build_trace(request), args.repeat)
        for layer in args.layers:
            walk_s, walk = median_seconds(lambda: build_walkthrough(request, layer, trace), args.repeat)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"| {trace.n_tokens} | {trace_s:.2f} s | {layer} | {walk_s:.2f} s | {walk_s / trace_s:.2f} | "
                  f"{arrays_nbytes(walk) / 1e6:.1f} MB | {peak:.0f} MB |", flush=True)


if __name__ == "__main__":
    main()
