"""Time activation patching on the bundled SmolLM2-135M with a 20-token pair, against the issue's targets.

Run: .venv/bin/python bench/bench_patching.py [--repeat N] [--threads T] [--no-page]
Prints: one forward pass of the route (batch one, the metric's path); the two prompts' runs; attribution patching and
its ratio to one forward pass (target ≤ 3×); exact patching of all 270 heads (target ≤ 20 s) and of the residual
stream; the rank correlation of the two; and, unless --no-page, the patching page opened from a link against the
heatmaps page opened from a link on the clean prompt (Streamlit's AppTest: the server's time, caches cleared before
each opening; target ≤ 1.5×).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CLEAN = "When Mary and John went to the store after a long day at work, John gave a drink to"
CORRUPT = "When Mary and John went to the store after a long day at work, Mary gave a drink to"
ANSWER, FOIL = " Mary", " John"
N_TOKENS = 20
TARGETS = {"exact_heads_s": 20.0, "attribution_x_forward": 3.0, "page_x_heatmaps": 1.5}


def _timed(fn, repeat: int) -> tuple[float, float, object]:
    """(best, median) seconds of ``repeat`` calls, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times), result


def _verdict(value: float, target: float) -> str:
    return "meets" if value <= target else "MISSES"


def bench_core(repeat: int) -> None:
    import torch

    from model_core.effects.patching import exact_patching, prepare_runs, run_metric
    from model_core.effects.patching_attribution import (
        attribution_patching,
        rank_correlation,
    )
    from model_core.effects.patching_inputs import prepare_inputs
    from model_core.settings import BUNDLED_DECODER_ID
    from model_core.trace.request import TraceRequest
    from model_core.trace.resolve import resolve

    resolved = resolve(TraceRequest("pretrained", CLEAN, model_id=BUNDLED_DECODER_ID), device="cpu")
    family, model = resolved.family, resolved.model
    inputs = prepare_inputs(resolved, CLEAN, CORRUPT, ANSWER, FOIL)
    assert inputs.n_tokens == N_TOKENS, f"the pair is {inputs.n_tokens} tokens, not {N_TOKENS}"
    print(f"{resolved.description}; {N_TOKENS}-token pair; torch threads {torch.get_num_threads()}; "
          f"best / median of {repeat}")
    forward, forward_med, _ = _timed(lambda: run_metric(family, model, inputs.corrupt_ids, inputs), max(3 * repeat, 10))
    print(f"one forward pass (route, batch 1, metric)   {forward:8.3f} s  (median {forward_med:.3f})")
    runs_s, _, runs = _timed(lambda: prepare_runs(family, model, inputs), repeat)
    print(f"both prompts' runs (z and resid_pre kept)   {runs_s:8.3f} s")
    attr_s, attr_med, attr = _timed(lambda: attribution_patching(family, model, runs), repeat)
    ratio = attr_s / forward
    print(f"attribution patching (forward + backward)   {attr_s:8.3f} s  (median {attr_med:.3f}) = {ratio:.2f}x one "
          f"forward; target <= {TARGETS['attribution_x_forward']:.0f}x  {_verdict(ratio, TARGETS['attribution_x_forward'])}")
    heads_s, heads_med, exact = _timed(lambda: exact_patching(family, model, runs, residual=False), repeat)
    print(f"exact patching, all {runs.n_layers * runs.n_heads} heads            {heads_s:8.2f} s  (median "
          f"{heads_med:.2f}); target <= {TARGETS['exact_heads_s']:.0f} s  {_verdict(heads_s, TARGETS['exact_heads_s'])}")
    resid_s, _, resid = _timed(lambda: exact_patching(family, model, runs, heads=False), 1)
    print(f"exact patching, residual {runs.n_layers} x {N_TOKENS} positions     {resid_s:8.2f} s (positions before "
          f"the first changed token cost nothing)")
    print(f"rank correlation, attribution vs exact: heads {rank_correlation(attr.heads, exact.heads):.3f}, residual "
          f"{rank_correlation(attr.residual, resid.residual):.3f}; metric clean {runs.clean:.3f}, corrupt "
          f"{runs.corrupt:.3f}")


def _open_seconds(page: str, query: dict[str, str]) -> float:
    """Seconds for app.py and ``page`` opened from a link, with every trace and derived cache cleared first (the
    model stays loaded)."""
    from streamlit.testing.v1 import AppTest

    from ui import patching
    from ui.loaders import TRACES
    from ui.trace_cache import DERIVED

    TRACES.clear()
    DERIVED.clear()
    patching.patch_base.clear()
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "app.py"), default_timeout=600)
    for name, value in query.items():
        at.query_params[name] = value
    start = time.perf_counter()
    at.run()
    at.switch_page(page).run()
    seconds = time.perf_counter() - start
    assert not at.exception, [e.value for e in at.exception]
    return seconds


def bench_page(repeat: int) -> None:
    from model_core.settings import BUNDLED_DECODER_ID

    model = {"model": "pretrained", "model_id": BUNDLED_DECODER_ID, "text_a": CLEAN, "text_b": ""}
    link = {**model, "clean": CLEAN, "corrupt": CORRUPT, "patch_answer": ANSWER, "patch_foil": FOIL}
    _open_seconds("pages/heatmaps.py", model)  # loads the model once, for both
    heatmaps = [_open_seconds("pages/heatmaps.py", model) for _ in range(repeat)]
    patching = [_open_seconds("pages/patching.py", link) for _ in range(repeat)]
    ratio = statistics.median(patching) / statistics.median(heatmaps)
    print(f"page from a link (AppTest, server time, median of {repeat}): heatmaps {statistics.median(heatmaps):.2f} s, "
          f"patching {statistics.median(patching):.2f} s = {ratio:.2f}x; target <= {TARGETS['page_x_heatmaps']}x  "
          f"{_verdict(ratio, TARGETS['page_x_heatmaps'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                        help="torch threads; default: the app server's (half the cores: 1 on the target's 2-core "
                             "CPU, where 2 threads beside any other job spin-wait and run 3-5x slower)")
    parser.add_argument("--no-page", action="store_true", help="skip the pages' timing")
    args = parser.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    bench_core(args.repeat)
    if not args.no_page:
        bench_page(args.repeat)


if __name__ == "__main__":
    main()
