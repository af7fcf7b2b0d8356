"""The ``neighbours`` verb: the corpus tokens nearest to a token of a text (a run made with ``corpus --index``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_neighbours_parser(sub: Any) -> None:
    """Add the ``neighbours`` verb to the command line's subparsers."""
    nb = sub.add_parser("neighbours", help="the corpus tokens nearest to a token of a text (a run made with --index)")
    nb.add_argument("--run", required=True, help="a run folder made with --index")
    nb.add_argument("--text", required=True, help="sentence A")
    nb.add_argument("--text-b", default=None, help="optional sentence B")
    nb.add_argument("--position", type=int, required=True, help="the token's position ([CLS] is 0)")
    nb.add_argument("--layer", type=int, required=True, help="0 = embeddings, 1.. = after each layer")
    nb.add_argument("--k", type=int, default=10)
    nb.add_argument("--device", default=None)
    nb.add_argument("--json", action="store_true", help="print a JSON list (best first)")


def neighbours_main(args: argparse.Namespace) -> int:
    """The ``neighbours`` verb: a JSON list of {text_index, position, token, text, score}, best first."""
    # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
    from model_core.corpus.neighbours import neighbours

    try:
        found = neighbours(args.run, args.text, args.text_b, position=args.position, layer=args.layer, k=args.k,
                           device=args.device)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(found, ensure_ascii=False, indent=1))
    else:
        for f in found:
            print(f"{f['score']:.4f}  {f['token']:<15} text {f['text_index']}, position {f['position']}: {f['text']}")
    return 0
