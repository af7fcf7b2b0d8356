"""Time direct logit attribution on the bundled SmolLM2-135M once the trace exists, against the issue's 0.5 s target.

Run: .venv/bin/python bench/bench_attribution.py [--repeat N] [--threads T]
Prints, for 128 and 512 tokens: the full trace's time (for scale), then the best and the median of N attributions of
the top prediction against the runner-up at the last token, and one head's split over its source tokens.
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
    ids = tokenizer.encode(TEXT * (n // 20 + 2), add_special_tokens=False)[:n]
    return tokenizer.decode(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the target is a 2-core CPU)")
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


if __name__ == "__main__":
    main()
