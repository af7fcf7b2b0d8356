"""The ``roles`` verb: ``python -m model_core roles --model pretrained --model-id ID [--seed S] [--json]``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from model_core.cli._common import model_verb_parser
from model_core.cli.options import add_encoder_shape_options
from model_core.cli.run_memory_flag import add_run_memory_flag, apply_run_memory_flag

if TYPE_CHECKING:  # the probes import torch: loaded when the verb runs, not for --help
    from model_core.roles.probes import RoleScores


def add_roles_parser(sub: Any) -> None:
    """Add the ``roles`` verb to the command line's subparsers."""
    roles = model_verb_parser(sub, "roles", "score every head as a previous-token, duplicate-token, induction, sink "
                              "and retrieval head; print the L x H scores and the top heads",
                              "pretrained: a transformers model of any supported family; custom: the chapter-3 encoder",
                              "hub id, folder, or a bundled id (default: the bundled BERT)")
    roles.add_argument("--seed", type=int, default=0, help="draws the probe's random words and the password")
    roles.add_argument("--weights", choices=["random", "pretrained"], default="random", help="custom encoder only")
    roles.add_argument("--weights-seed", type=int, default=0, help="custom encoder with random weights only")
    roles.add_argument("--causal", action="store_true", help="custom encoder only: apply the causal mask")
    add_encoder_shape_options(roles)
    roles.add_argument("--no-retrieval", action="store_true", help="skip the retrieval probe (it decodes; slower)")
    roles.add_argument("--top", type=int, default=10, help="how many top heads to list per role")
    roles.add_argument("--device", default=None, help="auto, cpu, cuda or mps")
    add_run_memory_flag(roles)
    roles.add_argument("--json", action="store_true", help="print JSON")


def run_roles(args: argparse.Namespace) -> tuple[RoleScores, dict[str, Any]]:
    """Score the model of ``args``: the four probes, then retrieval where the model is a decoder."""
    # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
    from model_core.roles.probes import ENCODER_NOTES, score_roles
    from model_core.roles.retrieval import retrieval_scores
    from model_core.trace.request import TraceRequest

    request = TraceRequest(args.model, "", model_id=args.model_id, weights=args.weights, seed=args.weights_seed,
                           causal=args.causal, num_hidden_layers=args.layers, num_attention_heads=args.heads, hidden_size=args.hidden)
    scores = score_roles(request, args.seed, device=args.device)
    extra: dict[str, Any] = {}
    if args.no_retrieval:
        return scores, extra
    if not scores.is_decoder:
        return scores.with_role("retrieval", np.full(scores.shape, np.nan), ENCODER_NOTES["retrieval"]), extra
    result = retrieval_scores(request, args.seed, device=args.device)
    extra = {"password": result.secret, "answers": list(result.answers), "copied": list(result.copied),
             "password_tokens": result.answer_tokens, "prompt_tokens": list(result.n_tokens)}
    note = (f"Needle-in-a-haystack, {result.n_tokens[0]} tokens, 3 depths; the model generated "
            f"{sum(result.copied)} of {len(result.copied) * result.answer_tokens} password tokens.")
    return scores.with_role("retrieval", result.scores, note), extra


def roles_main(args: argparse.Namespace) -> int:
    """The ``roles`` verb: JSON (``--json``) or a few lines per role."""
    apply_run_memory_flag(args)
    if args.model == "custom" and args.model_id and args.weights != "pretrained":
        print("error: --model-id applies to --model custom only with --weights pretrained", file=sys.stderr)
        return 2
    # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
    from model_core.roles.probes import ROLE_TITLES

    try:
        scores, extra = run_roles(args)
    except (ValueError, OSError) as exc:  # InputError and ModelLoadError are ValueErrors
        print(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({**scores.to_json(args.top), **({"retrieval": extra} if extra else {})}))
        return 0
    print(f"{scores.description}; probe seed {scores.seed}")
    for role in scores.scores:
        top = ", ".join(f"L{la}H{h} {s:.2f}" for la, h, s in scores.top_heads(role, args.top))
        print(f"{ROLE_TITLES[role]}: {top or '(none)'}")
        if role in scores.notes:
            print(f"  {scores.notes[role]}")
    return 0
