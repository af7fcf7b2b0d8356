"""Time every analysis of model_core.analysis on synthetic 12-layer x 12-head traces.

Run: .venv/bin/python bench/bench_analysis.py [--repeat N]
Prints one line per (analysis, token count): the best of N runs, in milliseconds. Attention flow
runs only up to its limits (FLOW_MAX_TOKENS for the full matrix, FLOW_MAX_TOKENS_ONE_ROW for the
[CLS] row); past them it raises, which is what the app relies on.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # synthetic traces live with the tests

from model_core.analysis import (  # noqa: E402
    FLOW_MAX_TOKENS,
    FLOW_MAX_TOKENS_ONE_ROW,
    analysis_arrays,
    attention_flow,
    attention_rollout,
    compare_masking,
    compare_word,
    head_mask_from_off,
    head_stats,
    norm_weighted_attention,
    special_token_mass,
)
from synthetic import synthetic_trace  # noqa: E402

SIZES = (13, 128, 512)
FLOW_SIZES = (13, 32, FLOW_MAX_TOKENS)
FLOW_ROW_SIZES = (13, 128, FLOW_MAX_TOKENS_ONE_ROW)


def best_ms(fn: Callable[[], object], repeat: int) -> float:
    """Best wall time of ``repeat`` calls, in milliseconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"{'analysis':<34}{'tokens':>8}{'ms':>12}")
    for n in SIZES:
        trace = synthetic_trace(n, 12, 12, d_head=32, seed=0)
        masked = synthetic_trace(n, 12, 12, d_head=32, seed=1, head_mask=head_mask_from_off(12, 12, [(3, 4)]))
        cases: dict[str, Callable[[], object]] = {
            "contexts (compare_word 'flies')": lambda t=trace: compare_word(t, "flies"),
            "rollout": lambda t=trace: attention_rollout(t.weights),
            "norm-weighted attention": lambda t=trace: norm_weighted_attention(t.weights, t.value_norms),
            "special-token mass": lambda t=trace: special_token_mass(t),
            "head statistics": lambda t=trace: head_stats(t),
            "masking comparison": lambda t=trace, m=masked: compare_masking(t, m),
        }
        if n <= FLOW_MAX_TOKENS:
            cases["analysis_arrays (all, with flow)"] = lambda t=trace: analysis_arrays(t)
        else:
            cases["analysis_arrays (all, no flow)"] = lambda t=trace: analysis_arrays(t)
        for name, fn in cases.items():
            print(f"{name:<34}{n:>8}{best_ms(fn, args.repeat):>12.1f}", flush=True)
    for n in FLOW_SIZES:
        trace = synthetic_trace(n, 12, 12, d_head=8, seed=0)
        ms = best_ms(lambda t=trace: attention_flow(t.weights), 1)
        print(f"{'flow, full matrix':<34}{n:>8}{ms:>12.1f}", flush=True)
    for n in FLOW_ROW_SIZES:
        trace = synthetic_trace(n, 12, 12, d_head=8, seed=0)
        ms = best_ms(lambda t=trace: attention_flow(t.weights, rows=[0]), 1)
        print(f"{'flow, [CLS] row only':<34}{n:>8}{ms:>12.1f}", flush=True)


if __name__ == "__main__":
    main()
