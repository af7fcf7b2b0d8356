"""Benchmark model_core: load and trace time, trace size and peak memory, for both models.

Run: ``.venv/bin/python bench/bench_model_core.py [--repeat 3] [--sizes 13 128 512]`` (``make bench``).

Three models, each measured in its own subprocess so that its peak RSS is its own:

* ``custom``: the from-scratch encoder at bert-base shape (12 layers x 12 heads, hidden 768), random weights;
* ``bert``: the bundled pretrained BERT (MiniLM-L6-H384, 6 x 12, hidden 384) through ``transformers``;
* ``custom+bert``: the from-scratch encoder loaded with the bundled BERT's weights.

For each it prints the load time (model build or load, tokenizer included), then for 13, 128 and
512 tokens the median trace time (tokenise + forward pass + collecting the AttentionTrace) over
``--repeat`` runs, the trace's size (``AttentionTrace.nbytes``) and the process's peak RSS so far.
CPU timings on a shared machine are noisy: the median is printed beside the fastest and slowest run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODELS = ("custom", "bert", "custom+bert")
SIZES = (13, 128, 512)
WORDS = ("the quick brown fox jumps over the lazy dog while a small bird sings in the old tree near the river "
         "and children play with a red ball on the green grass under the warm sun of a long summer day").split()


def texts_for(n_tokens: int) -> tuple[str, str]:
    """A sentence pair the uncased WordPiece vocabulary splits into exactly ``n_tokens`` tokens.

    13 tokens is the app's default pair; longer pairs repeat single-WordPiece words.
    """
    if n_tokens == 13:
        return "time flies like an arrow", "fruit flies like a banana"
    words = n_tokens - 3  # [CLS] a [SEP] b [SEP]
    seq = [WORDS[i % len(WORDS)] for i in range(words)]
    return " ".join(seq[: words // 2]), " ".join(seq[words // 2:])


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports kB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_one(kind: str, sizes: list[int], repeat: int) -> dict:
    """Load one model, trace each size ``repeat`` times; runs inside its own process."""
    import functools
    from dataclasses import replace

    import torch

    from model_core import Models, TraceRequest, build_custom_model, build_trace, select_device
    from model_core.trace.resolve import resolve

    torch.set_grad_enabled(False)
    rss_start = peak_rss_mb()
    models = Models(custom=functools.lru_cache(maxsize=1)(build_custom_model))  # built once, then reused
    if kind == "bert":
        request = TraceRequest("bert")
    else:
        request = TraceRequest("custom", weights="pretrained" if kind == "custom+bert" else "random")
    t0 = time.perf_counter()
    device = select_device()
    resolve(request, device=device, models=models)  # the model loaded (or built) once, as the app's cache keeps it
    load_s = time.perf_counter() - t0
    rows = []
    for n in sizes:
        a, b = texts_for(n)
        times, trace = [], None
        for _ in range(repeat):
            del trace  # keep at most one trace alive, so peak RSS is one trace's worth
            trace = None
            start = time.perf_counter()
            trace = build_trace(replace(request, text_a=a, text_b=b or ""), models=models)
            times.append(time.perf_counter() - start)
        assert trace.n_tokens == n, (trace.n_tokens, n)
        rows.append({"n": n, "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
                     "trace_mb": trace.nbytes / 1e6, "peak_rss_mb": peak_rss_mb(),
                     "shape": f"{trace.n_layers}x{trace.n_heads}, d_head {trace.d_head}"})
    return {"kind": kind, "load_s": load_s, "rss_after_import_mb": rss_start, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--one", choices=MODELS, help=argparse.SUPPRESS)  # internal: measure in this process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one, args.sizes, args.repeat)))
        return

    import torch

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
          f"{torch.__version__} ({torch.get_num_threads()} threads), no GPU used; median of {args.repeat} runs")
    results = []
    for kind in args.models:
        out = subprocess.run([sys.executable, __file__, "--one", kind, "--repeat", str(args.repeat), "--sizes",
                              *map(str, args.sizes)], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(f"{kind}: failed\n{out.stderr[-2000:]}")
            continue
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print()
    print("| model | shape | load | tokens | trace (median) | min-max | trace size | peak RSS |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    names = {"custom": "custom encoder, random weights", "bert": "bundled BERT (transformers)",
             "custom+bert": "custom encoder, bundled BERT's weights"}
    for res in results:
        for i, r in enumerate(res["rows"]):
            load = f"{res['load_s']:.2f} s" if i == 0 else ""
            print(f"| {names[res['kind']] if i == 0 else ''} | {r['shape'] if i == 0 else ''} | {load} | {r['n']} | "
                  f"{r['median_s'] * 1000:.0f} ms | {r['min_s'] * 1000:.0f}-{r['max_s'] * 1000:.0f} ms | "
                  f"{r['trace_mb']:.1f} MB | {r['peak_rss_mb']:.0f} MB |")
    print("\nload = model build/load + tokenizer, in a fresh process (imports not counted); trace = tokenise + "
          "forward + AttentionTrace; peak RSS = the process's high-water mark after that size (one trace alive).")


if __name__ == "__main__":
    main()
