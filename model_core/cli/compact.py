"""``export``'s long inputs: ``--text-file`` and ``--compact`` (a compact trace, ``model_core.compact.trace``; the
``weights`` verb, ``model_core.cli.weights``, reads any window of one back)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_export_options(exp: argparse.ArgumentParser) -> None:
    """``export``'s options for long inputs."""
    exp.add_argument("--text-file", default=None,
                     help="read sentence A from this UTF-8 file (a long prompt) instead of --text")
    exp.add_argument("--compact", action="store_true",
                     help="pretrained models: write a compact trace (.npz): queries, keys, each row's log-sum-exp, "
                          "exact block means and head statistics, no n x n weights; for inputs up to --max-tokens. "
                          "Read any window back with the `weights` verb")
    exp.add_argument("--max-tokens", type=int, default=None,
                     help="with --compact: the longest input (default AE_MAX_TOKENS, 4096 unless set; at most the "
                          "model's positions)")


def read_text(args: argparse.Namespace) -> str | None:
    """Sentence A from --text or --text-file; None (after a one-line error) when neither or both are given."""
    if (args.text is None) == (args.text_file is None):
        print("error: give the text with --text or --text-file (one of them)", file=sys.stderr)
        return None
    if args.text_file is None:
        return args.text
    try:
        return Path(args.text_file).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        print(f"error: cannot read --text-file {args.text_file}: {exc}", file=sys.stderr)
        return None


def export_compact(args: argparse.Namespace, text: str) -> int:
    """``export --compact``: build, save, and say what was written; progress on stderr."""
    # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
    from model_core.compact.build import build_compact
    from model_core.trace.request import TraceRequest

    if args.model == "custom":
        print("error: --compact is for pretrained models (any supported family); the chapter-3 encoder is exported "
              "in full (leave out --compact)", file=sys.stderr)
        return 2
    if not args.out.lower().endswith(".npz"):
        print(f"error: --out {args.out!r} must end in .npz for a compact trace", file=sys.stderr)
        return 2
    if args.max_tokens is not None and args.max_tokens < 2:
        print("error: --max-tokens must be at least 2", file=sys.stderr)
        return 2
    last = {"phase": None, "tenth": -1}

    def progress(phase: str, done: float) -> None:
        tenth = int(done * 10)
        if phase != last["phase"] or tenth != last["tenth"]:
            last.update(phase=phase, tenth=tenth)
            print(f"{phase}: {done:4.0%}", file=sys.stderr, flush=True)

    try:
        request = TraceRequest("pretrained", text, args.text_b, model_id=args.model_id, truncate=args.truncate)
        trace = build_compact(request, device=args.device, max_tokens=args.max_tokens, progress=progress)
        path = trace.save(args.out)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path} (compact: {trace.n_tokens} tokens, {trace.n_layers} layers x {trace.n_heads} heads, "
          f"{path.stat().st_size / 1e6:.0f} MB)")
    return 0
