"""Compact traces of long prompts (SmolLM2-135M): peak memory and time against the bare sdpa forward pass.

Each measurement runs in a child process of its own: `compact N` builds a compact trace of N tokens (sampling the
RSS every 5 ms) as the app does (no next-token predictions; the largest weight left for the page that asks),
`complete N` as `export --compact` does (both included), `sdpa N` times the same model's plain sdpa forward pass
of the same tokens. Prints one table of ratios from one run. Usage: python bench/bench_compact.py [--sizes 1024 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARAGRAPH = ("Field notes from the river station, day {i}. The morning gauge read {a} centimetres and the water was "
             "the colour of weak tea. Two herons worked the shallows below the weir while a kingfisher kept to the "
             "alders on the far bank. At noon the volunteers counted {b} stones along the old wall and sampled the "
             "pool beside the mill race; the afternoon stayed dry, and the evening gauge read {c} centimetres. ")


def long_text(n_words: int) -> str:
    """A team-written prompt of about ``n_words`` words, varied so that no two paragraphs are the same."""
    parts, words, i = [], 0, 0
    while words < n_words:
        p = PARAGRAPH.format(i=i + 1, a=40 + (i * 7) % 31, b=100 + (i * 13) % 57, c=38 + (i * 5) % 29)
        parts.append(p)
        words += len(p.split())
        i += 1
    return "".join(parts)


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _ids(tokenizer, n: int):
    import torch

    ids = tokenizer(long_text(n), add_special_tokens=False)["input_ids"][:n]
    assert len(ids) == n, len(ids)
    return torch.tensor([ids])


def child(mode: str, n: int) -> dict:
    import torch

    from model_core.models.bundled import ensure_bundled_decoder
    from model_core.settings import BUNDLED_DECODER_ID

    torch.set_num_threads(int(os.environ.get("AE_TORCH_THREADS") or os.cpu_count() or 1))
    if mode == "sdpa":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = ensure_bundled_decoder()
        tok = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").eval()
        ids = _ids(tok, n)
        with torch.inference_mode():
            model.model(input_ids=ids[:, :64], use_cache=False)  # warm up
            t = time.perf_counter()
            model.model(input_ids=ids, use_cache=False)
            return {"seconds": time.perf_counter() - t}
    from model_core.compact.build import build_compact
    from model_core.trace.request import Models, TraceRequest

    models = Models()
    loaded = models.pretrained(BUNDLED_DECODER_ID, torch.device("cpu"))
    text = loaded.tokenizer.decode(_ids(loaded.tokenizer, n)[0])
    build_compact(TraceRequest("pretrained", "warm up the kernels", model_id=BUNDLED_DECODER_ID), models=models,
                  device="cpu")
    base = rss_mb()
    peak = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mb())
            time.sleep(0.005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    t = time.perf_counter()
    complete = mode == "complete"
    trace = build_compact(TraceRequest("pretrained", text, model_id=BUNDLED_DECODER_ID), models=models,
                          device="cpu", max_tokens=8192, predictions=complete, largest_weight=complete)
    seconds = time.perf_counter() - t
    stop.set()
    thread.join()
    return {"seconds": seconds, "rss_loaded_mb": base, "rss_peak_mb": peak[0], "tokens": trace.n_tokens,
            "trace_mb": trace.nbytes() / 1e6}


def run_child(mode: str, n: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(n)], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; SmolLM2-135M, float32", flush=True)
    rows = []
    for n in args.sizes:
        sdpa = run_child("sdpa", n)
        compact = run_child("compact", n)
        complete = run_child("complete", n)
        rows.append((n, sdpa, compact, complete))
        print(f"  {n}: sdpa {sdpa['seconds']:.1f} s, compact {compact['seconds']:.1f} s, complete "
              f"{complete['seconds']:.1f} s, peak {compact['rss_peak_mb']:.0f} MB", flush=True)
    print("\n| tokens | bare sdpa forward | compact trace (app) | x sdpa | complete (export) | x sdpa | RSS loaded | "
          "peak RSS | above loaded | trace arrays | eager weights alone would be |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, sdpa, c, full in rows:
        eager_gb = 30 * 9 * n * n * 4 / 1e9
        print(f"| {n} | {sdpa['seconds']:.1f} s | {c['seconds']:.1f} s | {c['seconds'] / sdpa['seconds']:.2f} | "
              f"{full['seconds']:.1f} s | {full['seconds'] / sdpa['seconds']:.2f} | "
              f"{c['rss_loaded_mb']:.0f} MB | {c['rss_peak_mb']:.0f} MB | {c['rss_peak_mb'] - c['rss_loaded_mb']:.0f} MB"
              f" | {c['trace_mb']:.0f} MB | {eager_gb:.1f} GB |")
    if len(rows) > 1:
        (n0, _, c0, _), (n1, _, c1, _) = rows[0], rows[-1]
        growth = (c1["rss_peak_mb"] - c1["rss_loaded_mb"]) / (c0["rss_peak_mb"] - c0["rss_loaded_mb"])
        print(f"\nmemory above the loaded model grows {growth:.1f}x from {n0} to {n1} tokens "
              f"(linear {n1 / n0:.0f}x, quadratic {(n1 / n0) ** 2:.0f}x)")


if __name__ == "__main__":
    main()
