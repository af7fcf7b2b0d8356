"""The ``export`` verb: run a model on a text and write every attention tensor to .npz or .json (``--compact``:
a compact trace of a long input, ``model_core.cli.compact``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from model_core.cli.compact import add_export_options, export_compact, read_text
from model_core.cli.options import (
    MODEL_CHOICES,
    add_encoder_shape_options,
    custom_options_misused,
)


def add_export_parser(sub: Any) -> None:
    """Add the ``export`` verb to the command line's subparsers."""
    exp = sub.add_parser("export", help="run a model on a text and write every attention tensor to a file")
    exp.add_argument("--model", choices=MODEL_CHOICES, required=True,
                     help="pretrained: a transformers model of any supported family (see `models`); custom: the "
                          "chapter-3 encoder; bert: the old name of pretrained")
    exp.add_argument("--weights", choices=["random", "pretrained"], default="random",
                     help="custom encoder only: random (seeded) or BERT's weights from --model-id")
    exp.add_argument("--model-id", default=None, help="hub id, folder, or the bundled model (default)")
    exp.add_argument("--causal", action="store_true", help="custom encoder only: apply the causal mask")
    exp.add_argument("--seed", type=int, default=0, help="custom encoder only")
    add_encoder_shape_options(exp)
    exp.add_argument("--norm", choices=["pre", "post"], default="pre",
                     help="custom encoder with random weights only: pre-LayerNorm (the book) or post (BERT)")
    exp.add_argument("--text", default=None, help="sentence A (or --text-file)")
    exp.add_argument("--text-b", default=None, help="optional sentence B")
    exp.add_argument("--truncate", action="store_true", help="keep the first tokens of a text over the limit")
    exp.add_argument("--device", default=None, help="auto, cpu, cuda or mps")
    exp.add_argument("--out", required=True, help="FILE.npz or FILE.json")
    exp.add_argument("--words", action="store_true",
                     help="also write words, word_attentions (layer, head, q_word, k_word) and word_spans (word, 2): "
                          "WordPieces merged into words (attention to a word summed, from a word averaged)")
    add_export_options(exp)


def export_main(args: argparse.Namespace) -> int:
    """The ``export`` verb: build the trace through the one route and write it; a one-line error otherwise."""
    text = read_text(args)
    if text is None:
        return 2
    if args.compact:
        return export_compact(args, text)
    if not args.out.lower().endswith((".npz", ".json")):
        print(f"error: --out {args.out!r} must end in .npz or .json", file=sys.stderr)
        return 2
    if custom_options_misused(args):
        return 2
    try:
        # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
        from model_core.io.export import write_trace
        from model_core.trace.request import TraceRequest, build_trace

        request = TraceRequest(args.model, text, args.text_b, model_id=args.model_id, weights=args.weights,
                               seed=args.seed, causal=args.causal, norm_placement=args.norm, num_hidden_layers=args.layers,
                               num_attention_heads=args.heads, hidden_size=args.hidden, truncate=args.truncate)
        trace = build_trace(request, device=args.device)
        path = write_trace(trace, args.out, words=args.words)
    except (ValueError, OSError) as exc:  # InputError and ModelLoadError are ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path} ({trace.n_tokens} tokens, {trace.n_layers} layers x {trace.n_heads} heads)")
    return 0
