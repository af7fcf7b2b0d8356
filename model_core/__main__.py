"""Command line: ``python -m model_core export ...`` writes a trace to .npz or .json."""

from __future__ import annotations

import argparse
import sys

from model_core.export import write_trace


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m model_core", description="Attention Explorer's model core.")
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="run a model on a text and write every attention tensor to a file")
    exp.add_argument("--model", choices=["custom", "bert"], required=True)
    exp.add_argument("--weights", choices=["random", "pretrained"], default="random",
                     help="custom encoder only: random (seeded) or BERT's weights from --model-id")
    exp.add_argument("--model-id", default=None, help="hub id, folder, or the bundled model (default)")
    exp.add_argument("--causal", action="store_true", help="custom encoder only: apply the causal mask")
    exp.add_argument("--seed", type=int, default=0)
    exp.add_argument("--text", required=True, help="sentence A")
    exp.add_argument("--text-b", default=None, help="optional sentence B")
    exp.add_argument("--truncate", action="store_true", help="keep the first tokens of a text over the limit")
    exp.add_argument("--device", default=None, help="auto, cpu, cuda or mps")
    exp.add_argument("--out", required=True, help="FILE.npz or FILE.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not args.out.lower().endswith((".npz", ".json")):
        print(f"error: --out {args.out!r} must end in .npz or .json", file=sys.stderr)
        return 2
    if args.model == "bert" and (args.causal or args.weights != "random"):
        print("error: --causal and --weights apply to --model custom only; BERT is bidirectional", file=sys.stderr)
        return 2
    try:
        from model_core.tracing import build_trace

        trace = build_trace(args.model, args.text, args.text_b, weights=args.weights, model_id=args.model_id,
                            causal=args.causal, seed=args.seed, truncate=args.truncate, device=args.device)
        path = write_trace(trace, args.out)
    except (ValueError, OSError) as exc:  # InputError and ModelLoadError are ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path} ({trace.n_tokens} tokens, {trace.n_layers} layers x {trace.n_heads} heads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
