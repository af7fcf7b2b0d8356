"""Benchmark: the QK split on SmolLM2 (2 cores): one pair and the row view at 512 tokens, one pair at 4,096 tokens
against the compact trace of the same text. Prints figures; asserts nothing.

    .venv/bin/python bench/bench_qk.py
"""

from __future__ import annotations

import resource
import time

import torch

from model_core.compact.build import build_compact
from model_core.models.loading import load_pretrained
from model_core.qk.terms import qk_pass, split_at
from model_core.settings import BUNDLED_DECODER_ID
from model_core.trace.request import TraceRequest

WORDS = ("the lighthouse keeper counted seven blue herons before the storm reached the harbour and every boat came "
         "home").split()


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


def main() -> None:
    torch.set_num_threads(2)
    loaded = load_pretrained(BUNDLED_DECODER_ID, device="cpu")
    model, tok = loaded.model, loaded.tokenizer
    layer, head = 20, 4
    _, ids = _text(tok, 512)
    t_pass, pass_ = _time(lambda: qk_pass(model, ids, layer, head), repeat=2)
    tokens = tok.convert_ids_to_tokens(ids[0].tolist())
    t_pair, _ = _time(lambda: split_at(pass_, tokens, -1), repeat=5)
    t_row, _ = _time(lambda: split_at(pass_, tokens, -1, row=True), repeat=3)
    print(f"512 tokens, L{layer} H{head}: the head's hooked pass {t_pass:.2f} s; then one pair {t_pair * 1000:.1f} ms "
          f"(target 0.5 s); the row view {t_row * 1000:.1f} ms (target 3 s); first pair in all "
          f"{t_pass + t_pair:.2f} s")
    text, ids = _text(tok, 4096)
    request = TraceRequest("pretrained", text, model_id=BUNDLED_DECODER_ID, truncate=True)
    t_compact, _ = _time(lambda: build_compact(request, device="cpu"), repeat=1)
    t_long, pass_long = _time(lambda: qk_pass(model, ids, layer, head), repeat=1)
    tokens = tok.convert_ids_to_tokens(ids[0].tolist())
    t_long_pair, _ = _time(lambda: split_at(pass_long, tokens, -1), repeat=3)
    t_long_row, _ = _time(lambda: split_at(pass_long, tokens, -1, row=True), repeat=1)
    print(f"4,096 tokens: the compact trace {t_compact:.1f} s; one pair (its pass) {t_long + t_long_pair:.1f} s = "
          f"{(t_long + t_long_pair) / t_compact:.2f}x the compact trace (target 1.5x); the row view then "
          f"{t_long_row:.2f} s")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB")


if __name__ == "__main__":
    main()
