"""The ``weights`` verb: exact attention weights of any window of a compact trace (``export --compact``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np


def add_weights_parser(sub: Any) -> None:
    """Add the ``weights`` verb to the command line's subparsers."""
    w = sub.add_parser("weights", help="exact attention weights of any window of a compact trace (export --compact)")
    w.add_argument("--trace", required=True, help="a compact trace written by `export --compact`")
    w.add_argument("--layer", type=int, required=True)
    w.add_argument("--head", type=int, required=True)
    w.add_argument("--rows", default=None, help="query positions A:B, end excluded (default: all)")
    w.add_argument("--cols", default=None, help="key positions C:D, end excluded (default: all)")
    w.add_argument("--out", required=True, help="OUT.npy: a (rows, cols) float32 array")


def weights_main(args: argparse.Namespace) -> int:
    """The ``weights`` verb: one window of exact weights into a .npy file."""
    # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
    from model_core.compact.trace import load_compact, parse_window

    if not args.out.lower().endswith(".npy"):
        print(f"error: --out {args.out!r} must end in .npy", file=sys.stderr)
        return 2
    try:
        trace = load_compact(args.trace)
        rows = parse_window(args.rows, trace.n_tokens, "--rows")
        cols = parse_window(args.cols, trace.n_tokens, "--cols")
        window = trace.weights(args.layer, args.head, rows, cols)
        np.save(args.out, window)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: layer {args.layer}, head {args.head}, {window.shape[0]} x {window.shape[1]} weights")
    return 0
