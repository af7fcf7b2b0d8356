"""The ``circuit`` verb: ``python -m model_core circuit --model pretrained --model-id ID --dataset FILE.jsonl|ioi:64:0
[--method eap|eap-ig] [--steps M] [--top K] [--engine local|ray] [--batch-size B] --json``: edge attribution over a
dataset of prompt pairs (``model_core.circuits``) and the faithfulness curve of its circuits. With ``--json`` stdout
holds exactly one JSON object; progress, skipped pairs and logs go to stderr."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from model_core.cli.options import MODEL_CHOICES
from model_core.cli.run_memory_flag import add_run_memory_flag, apply_run_memory_flag

TOP = 20


def add_circuit_parser(sub: Any) -> None:
    """Add the ``circuit`` verb to the command line's subparsers."""
    p = sub.add_parser("circuit", help="edge attribution (EAP, EAP-IG) over a dataset of prompt pairs, and the "
                                       "faithfulness of the circuits it finds")
    p.add_argument("--model", choices=MODEL_CHOICES, required=True, help="pretrained: a decoder (SmolLM2, Llama, "
                                                                         "Qwen, GPT-2)")
    p.add_argument("--model-id", default=None, help="hub id, folder, or a bundled id such as "
                                                    "bundled:SmolLM2-135M-Instruct")
    p.add_argument("--dataset", required=True, metavar="FILE",
                   help="a JSONL or CSV file of pairs (clean, corrupt, answer, foil) or a generator spec "
                        "name:count:seed (ioi, greater-than, induction, facts; e.g. ioi:64:0)")
    p.add_argument("--method", choices=["eap", "eap-ig"], default="eap-ig",
                   help="eap: one gradient on the clean run; eap-ig (default): the gradient averaged over --steps "
                        "points from the corrupted to the clean input")
    p.add_argument("--steps", type=int, default=5, help="EAP-IG's points along the path (default 5; EAP uses 1)")
    p.add_argument("--top", type=int, default=None, metavar="K",
                   help="print only the top K edges by |score| (default: every edge, in graph order)")
    p.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="ray: split the pairs' batches across Ray workers (pip install 'ray[default]')")
    p.add_argument("--ray-address", default=None, help="a Ray cluster to join (default: a local instance)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="pairs a pass (pairs of one token count only; default 16 on a CPU, 64 on a GPU)")
    p.add_argument("--no-curve", action="store_true", help="skip the faithfulness curve (\"faithfulness\": null)")
    p.add_argument("--device", default=None, help="auto, cpu, cuda or mps")
    add_run_memory_flag(p)
    p.add_argument("--json", action="store_true",
                   help='print {"n", "clean", "corrupt", "method", "steps", "edges": [[sender, receiver, score], ...], '
                        '"faithfulness": {"fractions", "faithfulness", "cpr", "cmd"}}')


def circuit_main(args: argparse.Namespace) -> int:
    """The ``circuit`` verb: JSON (``--json``) or a summary; exit 1 with a one-line message on bad input."""
    apply_run_memory_flag(args)
    if args.model != "pretrained":
        _error("edge attribution compares next-token logits: use --model pretrained with a decoder (e.g. --model-id "
               "bundled:SmolLM2-135M-Instruct).")
        return 1
    if args.top is not None and args.top < 0:
        _error(f"--top is a count of edges ≥ 0, not {args.top}.")
        return 1
    # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
    from model_core.circuits.run import circuit

    try:
        result = circuit(args.dataset, model_id=args.model_id, method=args.method, steps=args.steps,
                         batch_size=args.batch_size, curve=not args.no_curve, engine=args.engine,
                         device=args.device, progress=_progress, ray_address=args.ray_address)
    except (ValueError, OSError) as exc:  # DatasetError, CircuitModelError, ModelLoadError are ValueErrors
        print(file=sys.stderr)  # after the progress line
        _error(str(exc) or type(exc).__name__)
        return 1
    print(file=sys.stderr)
    for problem in result.problems:
        print(f"skipped {problem}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.to_json(top=args.top)))
        return 0
    _print_text(result, args.top or TOP)
    return 0


def _error(message: str) -> None:
    print("error: " + " ".join(message.split()), file=sys.stderr)  # one line


def _progress(share: float, text: str) -> None:
    print(f"\rcircuit: {100 * share:5.1f}% {text}\033[K", end="", file=sys.stderr, flush=True)


def _print_text(result: Any, top: int) -> None:
    print(f"{result.n} pairs, {result.method} ({result.steps} step{'s' if result.steps != 1 else ''}); mean metric: "
          f"clean {result.clean:.4f}, corrupt {result.corrupt:.4f}; {result.scores.graph.n_edges} edges")
    print(f"top {top} edges by |score|:")
    for sender, receiver, score in result.scores.top(top):
        print(f"  {sender} -> {receiver}: {score:+.5f}")
    curve = result.curve
    if curve is not None:
        print("faithfulness: " + ", ".join(f"{f:g}: {v:.3f}" for f, v in zip(curve.fractions, curve.values)))
        print(f"CPR {curve.cpr:.4f}, CMD {curve.cmd:.4f} (linear axis; log axis: CPR {curve.cpr_log:.4f}, "
              f"CMD {curve.cmd_log:.4f})")
