"""The ``qk`` verb: ``python -m model_core qk --model pretrained --model-id ID --text TEXT --layer L --head H --query I
--key J [--versus K] --json``: why head H of layer L attends from I to J, the score split into query components x key
components (and why J rather than K)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from model_core.cli._common import custom_trace_request, model_verb_parser
from model_core.cli.options import add_custom_options, print_error
from model_core.cli.run_memory_flag import add_run_memory_flag, apply_run_memory_flag


def add_qk_parser(sub: Any) -> None:
    """Add the ``qk`` verb to the command line's subparsers."""
    qk = model_verb_parser(sub, "qk", "why a head attends from a query to a key: its score split into the query's and "
                           "the key's components (embeddings, each earlier head, each MLP)",
                           "pretrained: any supported family; custom: the chapter-3 encoder")
    qk.add_argument("--text", required=True, help="the text; positions index tokenizer(text).input_ids")
    qk.add_argument("--layer", type=int, required=True)
    qk.add_argument("--head", type=int, required=True)
    qk.add_argument("--query", type=int, default=-1, help="query position (negative: from the end; default: last)")
    qk.add_argument("--key", type=int, default=None, help="key position (default: the key the query attends to most)")
    qk.add_argument("--versus", type=int, default=None, help="a second key (default: the runner-up)")
    add_custom_options(qk)
    qk.add_argument("--device", default=None, help="auto, cpu, cuda or mps")
    add_run_memory_flag(qk)
    qk.add_argument("--json", action="store_true",
                    help='print {"tokens", "layer", "head", "query", "key", "score", "weight", "components", '
                         '"terms": C x C, "versus": {...}}')


def qk_main(args: argparse.Namespace) -> int:
    """The ``qk`` verb: JSON (``--json``) or the top pairs in words; exit 1 with the message on bad input."""
    apply_run_memory_flag(args)
    # torch and transformers load only when the verb runs, so `python -m model_core --help` stays quick
    from model_core.qk.terms import qk_for_request

    try:
        request = custom_trace_request(args, args.text)
        if not args.json:
            print("running the model once through its hook points...", file=sys.stderr)
        result = qk_for_request(request, args.layer, args.head, args.query, args.key, args.versus, device=args.device)
    except (ValueError, OSError) as exc:  # ModelLoadError and InputError are ValueErrors
        return print_error(exc)
    if args.json:
        if result.softcap is not None:
            print(f"note: this model caps its scores (softcap {result.softcap:g}); the terms split the score before "
                  f"the cap, and the log-odds are of the capped scores ({result.capped_score:+.6f} capped)",
                  file=sys.stderr)
        print(json.dumps(result.to_json()))
        return 0
    from model_core.qk.describe import (
        describe,  # start-up time, as above: torch only when the verb runs
    )

    for line in describe(result):
        print(line)
    return 0
