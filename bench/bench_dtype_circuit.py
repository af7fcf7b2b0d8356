"""How far a half-precision circuit is from float32's (issue 50: "the top-50 edges of a circuit overlap float32's by
≥ 45"): EAP-IG on IOI pairs with the bundled SmolLM2-135M-Instruct (its trained weights) on the CPU, in float32,
bfloat16 and float16, and in float32 with every weight rounded to bfloat16 first (the floor: what the weights'
own rounding moves).

Usage: .venv/bin/python bench/bench_dtype_circuit.py [--pairs 32] [--steps 5] [--top 50 200]
Prints, for each precision: how many of float32's top-k edges (by |score|) are also in its top k, the Spearman
correlation of all edge scores with float32's, the largest score difference relative to float32's largest |score|,
the run's time.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from model_core.circuits.datasets import load_dataset
from model_core.circuits.eap import circuit_model
from model_core.circuits.run import run_circuit
from model_core.models.bundled import ensure_bundled_decoder
from model_core.models.loading import load_pretrained_uncached
from model_core.settings import Settings


def _model(folder: str, dtype: str, rounded: bool = False):
    loaded = load_pretrained_uncached(folder, device="cpu", settings=Settings(dtype=dtype))
    if rounded:
        with torch.no_grad():
            for p in loaded.model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    return loaded


def _ranks(x: np.ndarray) -> np.ndarray:
    out = np.empty(len(x))
    out[np.argsort(x, kind="stable")] = np.arange(len(x))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, nargs="+", default=[50, 200])
    args = parser.parse_args()
    folder = str(ensure_bundled_decoder())
    dataset = load_dataset(f"ioi:{args.pairs}:0")
    runs = {}
    for label, dtype, rounded in [("float32", "float32", False), ("float32, weights rounded to bfloat16", "float32",
                                                                     True), ("bfloat16", "bfloat16", False),
                                  ("float16", "float16", False)]:
        loaded = _model(folder, dtype, rounded)
        cm = circuit_model(loaded.model, loaded.tokenizer)
        t0 = time.perf_counter()
        result = run_circuit(cm, dataset, method="eap-ig", steps=args.steps, curve=False)
        runs[label] = (result.scores.values().astype(np.float64), result.scores.ranking(), time.perf_counter() - t0)
    base, base_rank, _ = runs["float32"]
    print(f"EAP-IG({args.steps}) on ioi:{args.pairs}:0, SmolLM2-135M-Instruct on the CPU, {len(base):,} edges; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for label, (values, rank, seconds) in runs.items():
        overlaps = [len(set(base_rank[:k]) & set(rank[:k])) for k in args.top]
        spearman = np.corrcoef(_ranks(base), _ranks(values))[0, 1]
        largest = np.abs(values - base).max() / np.abs(base).max()
        tops = ", ".join(f"top-{k} {o}/{k}" for k, o in zip(args.top, overlaps))
        print(f"  {label:<38} {tops}; Spearman {spearman:.4f}; largest difference {largest:.4f} of the top score; "
              f"{seconds:.1f} s")


if __name__ == "__main__":
    main()
