"""The model's whole context (SmolLM2-135M, 8,192 positions): peak memory and time of the compact trace at 4,096
and 8,192 tokens, against the model alone.

Each measurement runs in a child process of its own, with ``AE_MAX_TOKENS=8192``, and reads the kernel's high-water
mark of its resident memory (``VmHWM``), so no short peak is missed:

- ``model``: load SmolLM2 and trace a short warm-up text; the model, the libraries and the warm-up's buffers.
- ``app N``: the same, then the compact trace of an N-token English text as the app builds it (no next-token
  predictions, the largest weight left for the page that asks).
- ``export N``: as ``export --compact`` builds it (predictions and the largest weight included), then saved.

"Above the model" is a child's peak minus the ``model`` child's. The issue's targets: the compact trace's peak
RSS <= 3.5 GB at 8,192 tokens, and memory above the model grows <= 2.2x from 4,096 to 8,192.

Usage: python bench/bench_long_context.py [--sizes 4096 8192] [--modes app export]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_PEAK_GB = 3.5
TARGET_GROWTH = 2.2


def high_water_mb() -> float:
    """This process's peak resident memory so far (``VmHWM``), in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024 * 1.048576  # kB -> MB (10^6 bytes)
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def english_text(tokenizer, n_tokens: int) -> str:
    """A team-written English text of exactly ``n_tokens`` SmolLM2 tokens (bench_compact's varied field notes)."""
    from bench.bench_compact import long_text

    ids = tokenizer(long_text(n_tokens), add_special_tokens=False)["input_ids"][:n_tokens]
    assert len(ids) == n_tokens, len(ids)
    text = tokenizer.decode(ids)
    assert len(tokenizer(text, add_special_tokens=False)["input_ids"]) == n_tokens
    return text


def child(mode: str, n: int) -> dict:
    import torch

    from model_core.compact.build import build_compact
    from model_core.settings import BUNDLED_DECODER_ID, load_settings
    from model_core.trace.request import Models, TraceRequest

    torch.set_num_threads(int(os.environ.get("AE_TORCH_THREADS") or os.cpu_count() or 1))
    settings, models = load_settings(), Models()
    loaded = models.pretrained(BUNDLED_DECODER_ID, torch.device("cpu"))
    build_compact(TraceRequest("pretrained", "warm up the kernels", model_id=BUNDLED_DECODER_ID), models=models,
                  settings=settings, device="cpu")
    if mode == "model":
        return {"rss_peak_mb": high_water_mb()}
    text = english_text(loaded.tokenizer, n)
    complete = mode == "export"
    start = time.perf_counter()
    trace = build_compact(TraceRequest("pretrained", text, model_id=BUNDLED_DECODER_ID), models=models,
                          settings=settings, device="cpu", max_tokens=None, predictions=complete,
                          largest_weight=complete)
    seconds = time.perf_counter() - start
    if complete:
        with tempfile.TemporaryDirectory() as folder:
            trace.save(Path(folder) / "long.npz")
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "rss_peak_mb": high_water_mb(), "tokens": trace.n_tokens, "chars": len(text),
            "trace_mb": trace.nbytes() / 1e6}


def run_child(mode: str, n: int) -> dict:
    env = {**os.environ, "AE_MAX_TOKENS": "8192", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(n)], capture_output=True, text=True,
                         check=True, cwd=ROOT, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--modes", nargs="+", default=["app", "export"], choices=["app", "export"])
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; SmolLM2-135M, float32, "
          "AE_MAX_TOKENS=8192", flush=True)
    model = run_child("model", 0)["rss_peak_mb"]
    print(f"model alone (loaded, one short trace): peak RSS {model:.0f} MB", flush=True)
    results: dict[str, list[tuple[int, dict]]] = {}
    for mode in args.modes:
        for n in args.sizes:
            r = run_child(mode, n)
            results.setdefault(mode, []).append((n, r))
            print(f"  {mode} {n}: {r['seconds']:.1f} s, peak {r['rss_peak_mb']:.0f} MB ({r['chars']:,} characters)",
                  flush=True)
    print("\n| build | tokens | characters | time | peak RSS | above the model | trace arrays |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for mode, rows in results.items():
        for n, r in rows:
            print(f"| {mode} | {n:,} | {r['chars']:,} | {r['seconds']:.1f} s | {r['rss_peak_mb']:.0f} MB | "
                  f"{r['rss_peak_mb'] - model:.0f} MB | {r['trace_mb']:.0f} MB |")
    for mode, rows in results.items():
        if len(rows) > 1:
            (n0, r0), (n1, r1) = rows[0], rows[-1]
            growth = (r1["rss_peak_mb"] - model) / (r0["rss_peak_mb"] - model)
            peak_gb = r1["rss_peak_mb"] / 1e3
            print(f"\n{mode}: peak RSS {peak_gb:.2f} GB at {n1:,} tokens (target <= {TARGET_PEAK_GB} GB: "
                  f"{'met' if peak_gb <= TARGET_PEAK_GB else 'NOT met'}); memory above the model grows {growth:.2f}x "
                  f"from {n0:,} to {n1:,} (target <= {TARGET_GROWTH}x: {'met' if growth <= TARGET_GROWTH else 'NOT met'})")


if __name__ == "__main__":
    main()
