"""The ``composition`` verb: ``python -m model_core composition --model pretrained --model-id ID [--json]``: the Q-, K-
and V-composition of every earlier head into every later head, from the weights alone, with the random baseline."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from model_core.cli._common import custom_trace_request, model_verb_parser
from model_core.cli.options import add_custom_options, print_error


def add_composition_parser(sub: Any) -> None:
    """Add the ``composition`` verb to the command line's subparsers."""
    comp = model_verb_parser(sub, "composition", "Q-, K- and V-composition scores of every pair of heads (Elhage et "
                             "al., 2021) from the weights, beside a random baseline",
                             "pretrained: a transformers model of any supported family; custom: the chapter-3 encoder")
    add_custom_options(comp)
    comp.add_argument("--seed", type=int, default=0, help="draws the random baseline's matrices")
    comp.add_argument("--top", type=int, default=10, help="how many top pairs of each kind to print (without --json)")
    comp.add_argument("--device", default=None, help="auto, cpu, cuda or mps")
    comp.add_argument("--json", action="store_true",
                      help='print {"q": LH x LH, "k": ..., "v": ..., "baseline": {"q", "k", "v"}}; rows the earlier '
                           "head, columns the later one, layer-major; null where a pair cannot compose")


def composition_main(args: argparse.Namespace) -> int:
    """The ``composition`` verb: JSON (``--json``) or the top pairs of each kind; exit 1 with the message on bad
    input."""
    if args.model == "custom" and args.model_id and args.weights != "pretrained":
        print("error: --model-id applies to --model custom only with --weights pretrained", file=sys.stderr)
        return 1
    # Start-up time: loaded when the verb runs, not for --help, as it imports torch and transformers.
    from model_core.qk.composition import composition_for_request

    try:
        request = custom_trace_request(args, "")
        if not args.json:
            print("reading the weights and composing every pair of heads...", file=sys.stderr)
        scores = composition_for_request(request, device=args.device, seed=args.seed)
    except (ValueError, OSError) as exc:  # ModelLoadError is a ValueError
        return print_error(exc)
    if args.json:
        print(json.dumps(scores.to_json()))
        return 0
    _print_text(scores, args.top)
    return 0


def _print_text(scores: Any, top: int) -> None:
    # Start-up time: the module imports torch, which --help does without.
    from model_core.qk.composition import KIND_TITLES, KINDS

    print(f"{scores.n_layers} layers x {scores.n_heads} heads; folded: {'; '.join(scores.folded) or 'nothing'}; "
          "the rotary embedding and the biases are left out")
    for kind in KINDS:
        base = scores.baseline[kind]
        print(f"{KIND_TITLES[kind]} (random baseline {base:.4f} ± {scores.baseline_std.get(kind, float('nan')):.4f}):")
        for p in scores.top_pairs(kind, top):
            print(f"  L{p.source_layer}H{p.source_head} -> L{p.target_layer}H{p.target_head}: {p.score:.4f} "
                  f"({p.ratio:.1f} x baseline)")
