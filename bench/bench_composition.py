"""Benchmark composition scores (``model_core.qk.composition``); print the figures.

Run: ``.venv/bin/python bench/bench_composition.py`` (under a minute on 2 cores; ``--repeat N``, ``--threads T``).

* **SmolLM2**: ``composition_scores`` of the bundled SmolLM2-135M (30 layers x 9 heads = 270 heads, d_model 576,
  d_head 64, 3 key/value heads a layer): the Q-, K- and V-composition of every pair of heads and the random
  baseline, the model loaded beforehand. Target <= 10 s on 2 cores. The parts: reading and folding the weights,
  the three kinds, the baseline.
* **GPT-2 shape**: the same on random weights of GPT-2 small's shape (12 x 12 heads, d_model 768, no grouped-query
  attention: the path where every head has its own keys and values), built in memory (no download).

Timings on a shared CPU are noisy (and torch's threads wait for each other when other processes hold the cores):
each is repeated and the median printed with the range.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s (range {min(values):.2f}-{max(values):.2f}, n={len(values)})"


def timed(fn, repeat: int) -> tuple[list[float], object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return times, result


def bench_smollm2(repeat: int) -> None:
    import torch

    from model_core.families.weights import layer_weights
    from model_core.models.loading import load_pretrained
    from model_core.qk import composition as comp
    from model_core.settings import BUNDLED_DECODER_ID

    model = load_pretrained(BUNDLED_DECODER_ID, device="cpu").model
    cpu = time.process_time()
    times, scores = timed(lambda: comp.composition_scores(model), repeat)
    cpu = (time.process_time() - cpu) / repeat
    print(f"SmolLM2-135M, all {scores.n_layers * scores.n_heads} heads: {spread(times)}  (target <= 10 s); "
          f"{cpu:.2f} CPU s a run (all threads: on idle cores the time is about this over the threads)")
    weights_t, weights = timed(lambda: layer_weights(model), repeat)
    fold_t, heads = timed(lambda: comp.fold_heads(weights), repeat)
    with torch.no_grad():
        kinds_t, _ = timed(lambda: comp._scores(heads), repeat)
    base_t, _ = timed(lambda: comp.random_baseline(weights[0].d_model, weights[0].d_head), repeat)
    print(f"  read weights {spread(weights_t)}; fold {spread(fold_t)}; Q, K and V {spread(kinds_t)}; "
          f"baseline {spread(base_t)}")
    for kind in comp.KINDS:
        top = ", ".join(f"L{p.source_layer}H{p.source_head}->L{p.target_layer}H{p.target_head} {p.score:.3f}"
                        for p in scores.top_pairs(kind, 3))
        print(f"  {comp.KIND_TITLES[kind]}: baseline {scores.baseline[kind]:.4f}; top {top}")


def bench_gpt2_shape(repeat: int) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from model_core.qk.composition import composition_scores

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=64)).eval()
    times, _ = timed(lambda: composition_scores(model), repeat)
    print(f"GPT-2 small's shape (144 heads, random weights): {spread(times)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own, the cores)")
    args = parser.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads: {torch.get_num_threads()}, cores: {os.cpu_count()}, load average: "
          f"{', '.join(f'{v:.1f}' for v in os.getloadavg())}")
    bench_smollm2(args.repeat)
    bench_gpt2_shape(args.repeat)


if __name__ == "__main__":
    main()
