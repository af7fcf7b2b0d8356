"""Time edge attribution and the faithfulness curve on the bundled SmolLM2-135M, against the issue's targets.

Run: .venv/bin/python bench/bench_circuits.py [--pairs N] [--steps M] [--threads T] [--batch-size B]
Prints: EAP-IG with M steps (default 5) on N IOI pairs (default 64, ``ioi:N:0``, 15 tokens each; target ≤ 60 s); the
faithfulness curve at the 10 fractions (target ≤ 60 s); its values, CPR and CMD (linear axis; the log-axis variants
beside); the faithfulness at 1% of the edges (target > 0.5); the process's peak RSS (target ≤ 3 GB); the load average
(other processes on the machine slow every figure).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS = {"scores_s": 60.0, "curve_s": 60.0, "peak_rss_gb": 3.0, "faithfulness_1pct": 0.5}


def _verdict(value: float, target: float, above: bool = False) -> str:
    return "meets" if (value > target if above else value <= target) else "MISSES"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from model_core.circuits.datasets import load_dataset, validate
    from model_core.circuits.eap import make_batches, score_batch
    from model_core.circuits.evaluate import faithfulness_curve
    from model_core.circuits.graph import EdgeScores
    from model_core.circuits.loading import load_circuit_model

    cm = load_circuit_model("bundled:SmolLM2-135M-Instruct", device="cpu")
    checked = validate(load_dataset(f"ioi:{args.pairs}:0"), cm.tokenizer).require()
    batches = make_batches(checked.pairs, args.batch_size)
    print(f"SmolLM2-135M-Instruct, {len(checked.pairs)} IOI pairs of {checked.n_tokens} tokens, {cm.graph.n_edges} "
          f"edges; torch threads {torch.get_num_threads()}, batch size {args.batch_size}; load average before "
          f"{os.getloadavg()[0]:.1f}")

    start = time.perf_counter()
    total = None
    n = 0
    for batch in batches:
        got = score_batch(cm, batch, args.steps)
        total = got.score_sum if total is None else total + got.score_sum
        n += len(got)
    scores_s = time.perf_counter() - start
    scores = EdgeScores(cm.graph, total / n)
    print(f"EAP-IG, {args.steps} steps, {n} pairs: {scores_s:.1f} s (target ≤ {TARGETS['scores_s']:.0f} s: "
          f"{_verdict(scores_s, TARGETS['scores_s'])})")

    start = time.perf_counter()
    curve = faithfulness_curve(cm, batches, scores)
    curve_s = time.perf_counter() - start
    print(f"faithfulness curve, 10 fractions: {curve_s:.1f} s (target ≤ {TARGETS['curve_s']:.0f} s: "
          f"{_verdict(curve_s, TARGETS['curve_s'])})")
    print("faithfulness: " + ", ".join(f"{f:g}: {v:.3f}" for f, v in zip(curve.fractions, curve.values)))
    print(f"CPR {curve.cpr:.4f}, CMD {curve.cmd:.4f} (linear axis); log axis: CPR {curve.cpr_log:.3f}, "
          f"CMD {curve.cmd_log:.3f}")
    at_1pct = curve.values[curve.fractions.index(0.01)]
    print(f"faithfulness at 1% of the edges: {at_1pct:.3f} (target > {TARGETS['faithfulness_1pct']}: "
          f"{_verdict(at_1pct, TARGETS['faithfulness_1pct'], above=True)})")
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # kB on Linux
    print(f"peak RSS {peak_gb:.2f} GB (target ≤ {TARGETS['peak_rss_gb']:.0f} GB: "
          f"{_verdict(peak_gb, TARGETS['peak_rss_gb'])}); load average after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
