"""How far a half-precision model's attention weights are from float32's, and how much of that gap is the weights'
own rounding: the bundled SmolLM2-135M-Instruct traced on the CPU in float32, bfloat16 and float16, and in float32
with every weight rounded to bfloat16 first (the floor: no bfloat16 model can be nearer float32 than its own weights
are). Attention scores and weights are float32 in every run (``model_core.families.hook_attention``); what differs is
the residual stream and the matrix products that feed the queries and keys.

Usage: .venv/bin/python bench/bench_dtype.py [--tokens 20 120 500]
Prints, for each text length and precision: the largest |weight − float32's|, its 99.9th and 99th percentiles, the
largest in each of the first two and last two layers, and the traced pass's time.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from model_core.models.bundled import ensure_bundled_decoder
from model_core.models.loading import load_pretrained_uncached
from model_core.settings import Settings
from model_core.trace.forward import trace_pretrained

BASE = ("When Mary and John went to the store, John gave a drink to Mary. Time flies like an arrow; fruit flies like a "
        "banana. The cat sat on the mat and watched the flies near the window, and the dog slept by the door. ")


def _rounded(folder: str):
    """The float32 model with every parameter rounded to bfloat16 and back."""
    loaded = load_pretrained_uncached(folder, device="cpu", settings=Settings(dtype="float32"))
    with torch.no_grad():
        for p in loaded.model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[20, 120, 500])
    args = parser.parse_args()
    folder = str(ensure_bundled_decoder())
    full = load_pretrained_uncached(folder, device="cpu", settings=Settings(dtype="float32"))
    others = {"bfloat16": load_pretrained_uncached(folder, device="cpu", settings=Settings(dtype="bfloat16")),
              "float16": load_pretrained_uncached(folder, device="cpu", settings=Settings(dtype="float16")),
              "float32, weights rounded to bfloat16": _rounded(folder)}
    print("SmolLM2-135M-Instruct on the CPU; |attention weight − float32's| over every layer, head, query and key")
    print(f"{'tokens':>6}  {'precision':<38} {'largest':>8} {'p99.9':>8} {'p99':>8}  largest a layer (first .. last)  "
          "time")
    for n in args.tokens:
        encoded = full.family.encode(full.tokenizer, BASE * (1 + n // 40), max_tokens=n, truncate=True)
        reference = trace_pretrained(full, encoded).weights
        for name, loaded in others.items():
            start = time.perf_counter()
            weights = trace_pretrained(loaded, encoded).weights
            seconds = time.perf_counter() - start
            gap = np.abs(weights - reference)
            per_layer = gap.reshape(gap.shape[0], -1).max(axis=1)
            print(f"{encoded.input_ids.shape[1]:>6}  {name:<38} {gap.max():>8.4f} {np.percentile(gap, 99.9):>8.4f} "
                  f"{np.percentile(gap, 99):>8.4f}  {per_layer[0]:.3f} {per_layer[1]:.3f} .. {per_layer[-2]:.3f} "
                  f"{per_layer[-1]:.3f}  {seconds:5.2f} s")


if __name__ == "__main__":
    main()
