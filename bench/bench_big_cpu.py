"""A model of billions of parameters on the CPU (issue 50: "a 1.5B-shaped random model traced at 512 tokens and run
through circuit on 8 pairs, with its peak RSS"): a random-weight model of a real shape built from its config (nothing
is downloaded), a full trace at 512 tokens, then EAP-IG with its faithfulness curve on IOI pairs.

Usage: .venv/bin/python bench/bench_big_cpu.py [--shape qwen2.5-1.5b] [--pairs 8] [--steps 5]
Prints JSON lines: the build (parameters, seconds, RSS), each step's seconds and its peak RSS above the loaded model
(VmHWM reset before each step through /proc/self/clear_refs). The full trace of a 28-layer x 12-head model at 512
tokens holds 352 MB of weights, over AE_FULL_TRACE_MB's default 320: this bench raises it to 400.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(key)).split()[1]) // 1024


def _measure(name: str, fn: Callable[[], Any]) -> Any:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM from here
    base = _status("VmRSS")
    t0 = time.perf_counter()
    out = fn()
    print(json.dumps(dict(step=name, seconds=round(time.perf_counter() - t0, 1),
                          peak_above_model_mb=_status("VmHWM") - base)), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen2.5-1.5b")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("AE_FULL_TRACE_MB", "400")
    import bench_gpu
    import torch
    import transformers

    from model_core.circuits.datasets import load_dataset
    from model_core.circuits.eap import circuit_model
    from model_core.circuits.run import run_circuit
    from model_core.trace.forward import trace_pretrained

    tokenizer = transformers.AutoTokenizer.from_pretrained(bench_gpu.tokenizer_folder(None))
    t0 = time.perf_counter()
    loaded, n, dtype = bench_gpu.build_model(args.shape, "cpu", "float32", tokenizer)
    print(json.dumps(dict(step="build", shape=args.shape, parameters=n, dtype=str(dtype), threads=torch.get_num_threads(),
                          seconds=round(time.perf_counter() - t0, 1), rss_mb=_status("VmRSS"))), flush=True)
    encoded = loaded.family.encode(tokenizer, bench_gpu.text_of(600, 1), max_tokens=512, truncate=True)
    _measure("trace 512 (first)", lambda: trace_pretrained(loaded, encoded))
    _measure("trace 512 (warm)", lambda: trace_pretrained(loaded, encoded))
    cm = circuit_model(loaded.model, tokenizer)
    dataset = load_dataset(f"ioi:{args.pairs}:0")
    result = _measure(f"EAP-IG({args.steps}) + curve, {args.pairs} IOI pairs",
                      lambda: run_circuit(cm, dataset, method="eap-ig", steps=args.steps, curve=True))
    print(json.dumps(dict(edges=int(result.scores.graph.n_edges), curve=[round(v, 3) for v in result.curve.values])))


if __name__ == "__main__":
    main()
