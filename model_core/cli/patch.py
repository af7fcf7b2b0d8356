"""The ``patch`` verb: ``python -m model_core patch --model pretrained --model-id ID --clean A --corrupt B --answer X
--foil Y [--json]``: activation patching of every head (and the residual stream), exact and by attribution; with
``--dataset FILE`` (JSONL, CSV or a generator spec such as ``ioi:8:0``) instead of the four texts, each head's mean
effect and its spread over the pairs (``model_core.circuits.mean_patching``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from model_core.cli.options import MODEL_ID_HELP, add_model_options
from model_core.cli.run_memory_flag import add_run_memory_flag, apply_run_memory_flag

TOP = 10


def add_patch_parser(sub: Any) -> None:
    """Add the ``patch`` verb to the command line's subparsers."""
    patch = sub.add_parser("patch", help="activation patching: each head's effect on logit(answer) - logit(foil) "
                                         "when its output is taken from the clean prompt into the corrupted one")
    add_model_options(patch, "pretrained: a decoder (GPT-2, Llama-like); an encoder cannot be patched", MODEL_ID_HELP)
    patch.add_argument("--clean", help="the clean prompt (all four texts, or --dataset)")
    patch.add_argument("--corrupt", help="the corrupted prompt, as many tokens as the clean one")
    patch.add_argument("--answer", help="one token as written, leading space included (\" Paris\")")
    patch.add_argument("--foil", help="one token as written (\" Rome\")")
    patch.add_argument("--dataset", default=None, metavar="FILE",
                       help="mean patching over pairs instead of one: a JSONL or CSV file (clean, corrupt, answer, "
                            "foil) or a generator spec name:count:seed (ioi, greater-than, induction, facts; e.g. "
                            "ioi:8:0). JSON: {n, heads, heads_std, residual, problems, clean, corrupt}")
    patch.add_argument("--no-residual", action="store_true", help="skip the residual stream's layer x position grid")
    patch.add_argument("--no-table", action="store_true", help="skip the table of attention beside effect")
    patch.add_argument("--device", default=None, help="auto, cpu, cuda or mps")
    add_run_memory_flag(patch)
    patch.add_argument("--json", action="store_true",
                       help='print {"clean", "corrupt", "heads": L x H, "attribution": L x H, "residual", ...}')


def patch_main(args: argparse.Namespace) -> int:
    """The ``patch`` verb: JSON (``--json``) or the metrics and the top heads; exit 1 with the message on bad input."""
    apply_run_memory_flag(args)
    # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
    from model_core.effects.patching_inputs import CONTRIBUTIONS_HINT
    from model_core.effects.patching_run import patch_prompts

    if args.model == "custom":
        print("error: activation patching compares next-token logits, and the chapter-3 encoder predicts no next "
              "token. Use --model pretrained with a decoder (e.g. --model-id bundled:SmolLM2-135M-Instruct). "
              + CONTRIBUTIONS_HINT, file=sys.stderr)
        return 1
    if args.dataset is not None:
        return _dataset_main(args)
    missing = [f"--{name}" for name in ("clean", "corrupt", "answer", "foil") if getattr(args, name) is None]
    if missing:
        print(f"error: give {', '.join(missing)} (a clean and a corrupted prompt, an answer and a foil), or "
              "--dataset FILE for mean patching over pairs.", file=sys.stderr)
        return 1
    progress = None if args.json else _progress
    try:
        result = patch_prompts(args.clean, args.corrupt, args.answer, args.foil, model_id=args.model_id,
                               device=args.device, table=not args.no_table, residual=not args.no_residual,
                               progress=progress)
    except (ValueError, OSError) as exc:  # PatchingError, InputError and ModelLoadError are ValueErrors
        print(f"error: {exc}" if str(exc) else f"error: {type(exc).__name__}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.to_json()))
        return 0
    print(file=sys.stderr)  # after the progress line
    _print_text(result)
    return 0


def _dataset_main(args: argparse.Namespace) -> int:
    """``--dataset``: mean patching over the pairs; the progress line on stderr, JSON or a summary on stdout."""
    # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
    from model_core.circuits.mean_patching import patch_dataset

    given = [f"--{name}" for name in ("clean", "corrupt", "answer", "foil") if getattr(args, name) is not None]
    if given:
        print(f"error: --dataset takes its pairs from the file; leave out {', '.join(given)}.", file=sys.stderr)
        return 1
    try:
        result = patch_dataset(args.dataset, model_id=args.model_id, device=args.device,
                               residual=not args.no_residual, progress=_dataset_progress)
    except (ValueError, OSError) as exc:  # DatasetError, NotADecoder, ModelLoadError are ValueErrors
        print(file=sys.stderr)
        print(f"error: {exc}" if str(exc) else f"error: {type(exc).__name__}", file=sys.stderr)
        return 1
    print(file=sys.stderr)  # after the progress line
    for problem in result.problems:
        print(f"skipped {problem}", file=sys.stderr)
    if result.residual_note and not args.no_residual:
        print(result.residual_note, file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_json()))
        return 0
    _print_dataset(result)
    return 0


def _dataset_progress(done: float, total: int) -> None:
    print(f"\rmean patching: {done:.1f}/{total} pairs", end="", file=sys.stderr, flush=True)


def _print_dataset(result: Any) -> None:
    print(f"{result.n} pairs; mean metric: clean {result.clean:.4f}, corrupt {result.corrupt:.4f}")
    order = np.argsort(-np.abs(np.nan_to_num(result.heads)), axis=None)[:TOP]
    print("top heads by |mean effect| (std over the pairs):")
    for flat in order:
        layer, head = np.unravel_index(flat, result.heads.shape)
        print(f"  L{layer}H{head}: {result.heads[layer, head]:+.3f} ({result.heads_std[layer, head]:.3f})")


def _progress(done: int, total: int) -> None:
    print(f"\rexact patching: {done}/{total} patched passes", end="", file=sys.stderr, flush=True)


def _print_text(result: Any) -> None:
    runs = result.runs
    inputs = runs.inputs
    print(f"metric logit({inputs.answer!r}) - logit({inputs.foil!r}): clean {runs.clean:.4f}, corrupt "
          f"{runs.corrupt:.4f}; {inputs.n_tokens} tokens, differing at {inputs.differing.tolist()}")
    heads = result.exact.heads
    order = np.argsort(-np.abs(np.nan_to_num(heads)), axis=None)[:TOP]
    print("top heads by |effect| (exact; attribution estimate):")
    for flat in order:
        layer, head = np.unravel_index(flat, heads.shape)
        print(f"  L{layer}H{head}: {heads[layer, head]:+.3f} ({result.attribution.heads[layer, head]:+.3f})")
    rho = result.rank_correlation
    print(f"rank correlation of attribution with exact patching: heads {rho['heads']:.3f}, residual "
          f"{rho['residual']:.3f}")
    if result.table is not None:
        corr = result.table.correlations()
        print(f"rank correlation of attention to the changed tokens with |effect|: "
              f"{corr['attention_vs_abs_effect']:.3f}")
