"""Benchmark: the QK split on SmolLM2 (2 cores): one pair and the row view at 512 tokens, the first pair from a cached
full trace (the page's case: the parts built from the trace, no model run) against the head's hooked pass, and one
pair at 4,096 tokens against the compact trace of the same text. Prints figures; asserts nothing.

    .venv/bin/python bench/bench_qk.py
"""

from __future__ import annotations

import resource
import time

import torch

from model_core.compact.build import build_compact
from model_core.models.loading import load_pretrained
from model_core.qk.terms import qk_pass, qk_pass_for_trace, split_at
from model_core.settings import BUNDLED_DECODER_ID
from model_core.trace.request import TraceRequest, build_trace

WORDS = ["the", "lighthouse", "keeper", "counted", "seven", "blue", "herons", "before", "the", "storm", "reached", "the", "harbour", "and", "every", "boat", "came", "home"]


def _text(tokenizer, n: int) -> tuple[str, torch.Tensor]:
    words = []
    while True:
        words.append(WORDS[len(words) % len(WORDS)])
        text = " ".join(words)
        ids = tokenizer(text).input_ids
        if len(ids) >= n:
            return text, torch.tensor([ids[:n]])


def _time(fn, repeat: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def _measure(model, tok, n: int, layer: int, head: int, repeat: int) -> dict[str, float]:
    """The head's pass, then one pair and the row view from it (best of ``repeat``), at ``n`` tokens."""
    _, ids = _text(tok, n)
    t_pass, pass_ = _time(lambda: qk_pass(model, ids, layer, head), repeat=min(repeat, 2))
    tokens = tok.convert_ids_to_tokens(ids[0].tolist())
    t_pair, _ = _time(lambda: split_at(pass_, tokens, -1), repeat=repeat + 2)
    t_row, _ = _time(lambda: split_at(pass_, tokens, -1, row=True), repeat=repeat)
    return {"pass": t_pass, "pair": t_pair, "row": t_row}


def main() -> None:
    torch.set_num_threads(2)
    loaded = load_pretrained(BUNDLED_DECODER_ID, device="cpu")
    model, tok = loaded.model, loaded.tokenizer
    layer, head = 20, 4
    short = _measure(model, tok, 512, layer, head, repeat=3)
    print(f"512 tokens, L{layer} H{head}: the head's hooked pass {short['pass']:.2f} s; then one pair "
          f"{short['pair'] * 1000:.1f} ms (target 0.5 s); the row view {short['row'] * 1000:.1f} ms (target 3 s); "
          f"first pair in all {short['pass'] + short['pair']:.2f} s")
    text, ids = _text(tok, 512)
    request = TraceRequest("pretrained", tok.decode(ids[0]), model_id=BUNDLED_DECODER_ID, truncate=True)
    t_trace, trace = _time(lambda: build_trace(request, device="cpu"), repeat=1)
    tokens = list(trace.tokens)
    t_first, _ = _time(lambda: split_at(qk_pass_for_trace(model, trace, layer, head), tokens, -1), repeat=3)
    t_hooked, _ = _time(lambda: split_at(qk_pass(model, torch.tensor([list(trace.token_ids)]), layer, head),
                                         tokens, -1), repeat=2)
    print(f"{len(tokens)} tokens, from a cached full trace (built in {t_trace:.2f} s): the first pair "
          f"{t_first:.3f} s (target 0.5 s) against {t_hooked:.2f} s by the head's hooked pass "
          f"({t_hooked / t_first:.1f}x)")
    text, _ = _text(tok, 4096)
    request = TraceRequest("pretrained", text, model_id=BUNDLED_DECODER_ID, truncate=True)
    t_compact, _ = _time(lambda: build_compact(request, device="cpu"), repeat=1)
    long = _measure(model, tok, 4096, layer, head, repeat=1)
    first = long["pass"] + long["pair"]
    print(f"4,096 tokens: the compact trace {t_compact:.1f} s; one pair (its pass) {first:.1f} s = "
          f"{first / t_compact:.2f}x the compact trace (target 1.5x); the row view then {long['row']:.2f} s")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")


if __name__ == "__main__":
    main()
