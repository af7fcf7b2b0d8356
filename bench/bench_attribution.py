"""Time direct logit attribution on the bundled SmolLM2-135M once the trace exists, against the issue's 0.5 s target.

Run: .venv/bin/python bench/bench_attribution.py [--repeat N] [--threads T] [--long 4096]
Prints, for 128 and 512 tokens: the full trace's time (for scale), then the best and the median of N attributions of
the top prediction against the runner-up at the last token, and one head's split over its source tokens. With
``--long N``: a text of N tokens, past the full trace's limit, attributed from one extra compact pass (no target in
the issue; it costs about one compact forward pass).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_S = 0.5
SIZES = (128, 512)
TEXT = ("The cat sat on the mat and watched the flies near the window. The dog slept by the door. When the sun came "
        "out, the children ran to the garden to play, and the cat followed them slowly. ")


def _text_of(tokenizer, n: int) -> str:
    """A text that the tokenizer reads as exactly ``n`` tokens."""
    ids = tokenizer.encode(TEXT * (n // 35 + 2), add_special_tokens=False)[:n]
    return tokenizer.decode(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the target is a 2-core CPU)")
    parser.add_argument("--long", type=int, default=0, help="also time a long text of this many tokens (0: skip)")
    args = parser.parse_args()

    import torch

    from model_core.effects.attribution import attribute, top_two
    from model_core.models.loading import load_pretrained
    from model_core.settings import BUNDLED_DECODER_ID
    from model_core.trace.forward import trace_pretrained

    torch.set_num_threads(args.threads)
    loaded = load_pretrained(BUNDLED_DECODER_ID, device="cpu")
    print(f"{loaded.description}; torch threads {args.threads}; best / median of {args.repeat}")
    print(f"{'tokens':>7}{'trace s':>10}{'DLA best s':>12}{'DLA median s':>14}{'split s':>10}{'target s':>10}")
    for n in SIZES:
        encoded = loaded.family.encode(loaded.tokenizer, _text_of(loaded.tokenizer, n), max_tokens=4096)
        start = time.perf_counter()
        trace = trace_pretrained(loaded, encoded)
        traced = time.perf_counter() - start
        answer, foil = top_two(trace)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            result = attribute(trace, loaded.model, loaded.family, answer, foil)
            times.append(time.perf_counter() - start)
        layer, head = divmod(int(abs(result.heads).argmax()), result.n_heads)
        start = time.perf_counter()
        result.sources(trace, layer, head)
        split = time.perf_counter() - start
        verdict = "meets" if min(times) <= TARGET_S else "MISSES"
        print(f"{trace.n_tokens:>7}{traced:>10.2f}{min(times):>12.3f}{statistics.median(times):>14.3f}{split:>10.4f}"
              f"{TARGET_S:>10.1f}  {verdict}")
    if args.long:
        from model_core.effects.attribution_long import (
            attribute_last,
            last_position_pass,
        )

        encoded = loaded.family.encode(loaded.tokenizer, _text_of(loaded.tokenizer, args.long), max_tokens=8192)
        ids = encoded.input_ids[0].numpy()
        start = time.perf_counter()
        last = last_position_pass(loaded.family, loaded.model, ids)
        passed = time.perf_counter() - start
        start = time.perf_counter()
        result = attribute_last(loaded.family, loaded.model, ids, encoded.tokens, *(int(i) for i in last.top_ids[:2]),
                                last=last)
        split = time.perf_counter() - start
        print(f"{len(ids):>7} tokens (compact): one extra pass {passed:.2f} s, then the attribution {split:.3f} s "
              f"(parts sum {result.total:.4f}, logit {result.logit:.4f})")


if __name__ == "__main__":
    main()
