"""The ``generate`` verb: ``python -m model_core generate --model pretrained --model-id ID --prompt TEXT
--max-new-tokens N [--chat] [--sample --temperature T --top-p P --seed S] --json [--out FILE.npz]``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from model_core.cli.options import MODEL_CHOICES
from model_core.cli.run_memory_flag import add_run_memory_flag, apply_run_memory_flag

JSON_HELP = ('print {"prompt_tokens": k, "token_ids": [...], "tokens": [...], "text": reply}: token_ids and tokens are '
             "the NEW tokens only (the reply; an end-of-sequence token that ended it is kept), prompt_tokens the "
             "prompt's length in tokens (the chat template's included), text the new ids decoded with special "
             "tokens skipped (a leading space kept)")


def add_generate_parser(sub: Any) -> None:
    """Add the ``generate`` verb to the command line's subparsers."""
    gen = sub.add_parser("generate", help="generate a reply with a decoder through the one forward route (greedy, "
                                          "or sampled); optionally write the whole sequence's trace")
    gen.add_argument("--model", choices=MODEL_CHOICES, required=True,
                     help="pretrained: a decoder language model (the chapter-3 encoder does not generate)")
    gen.add_argument("--model-id", default=None,
                     help="hub id or folder of a decoder, e.g. bundled:SmolLM2-135M-Instruct")
    gen.add_argument("--prompt", required=True, help="the prompt (with --chat: the user's message)")
    gen.add_argument("--max-new-tokens", type=int, default=48, help="the most new tokens (default 48)")
    gen.add_argument("--chat", action="store_true",
                     help="wrap the prompt in the model's chat template, the assistant's turn opened")
    gen.add_argument("--sample", action="store_true", help="sample (default: greedy, as generate(do_sample=False))")
    gen.add_argument("--temperature", type=float, default=1.0, help="sampling only: > 0 (default 1)")
    gen.add_argument("--top-p", type=float, default=1.0, help="sampling only: in (0, 1] (default 1: every token)")
    gen.add_argument("--seed", type=int, default=0, help="sampling only: the random seed (default 0)")
    gen.add_argument("--device", default=None, help="auto, cpu, cuda or mps")
    add_run_memory_flag(gen)
    gen.add_argument("--json", action="store_true", help=JSON_HELP)
    gen.add_argument("--out", default=None,
                     help="FILE.npz or FILE.json: the whole sequence's trace (prompt and reply, up to and including "
                          "the last generated token) in the export format, with reply_start; a sequence too long "
                          "for a full trace (AE_FULL_TRACE_MB) is written as a compact trace (.npz)")


def generate_main(args: argparse.Namespace) -> int:
    """The ``generate`` verb: JSON (``--json``) or the reply and a summary line; a one-line error otherwise."""
    apply_run_memory_flag(args)
    if args.model == "custom":
        print("error: the chapter-3 encoder does not generate text; use --model pretrained with a decoder's "
              "--model-id", file=sys.stderr)
        return 2
    if args.out is not None and not args.out.lower().endswith((".npz", ".json")):
        print(f"error: --out {args.out!r} must end in .npz or .json", file=sys.stderr)
        return 2
    try:
        generation, resolved = _generate(args)
        written = _write(generation, resolved, args) if args.out else None
    except (ValueError, OSError) as exc:  # InputError and ModelLoadError are ValueErrors
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"prompt_tokens": len(generation.prompt_ids),
                          "token_ids": [int(i) for i in generation.new_ids], "tokens": list(generation.tokens),
                          "text": generation.reply}, ensure_ascii=False))
    else:
        print(generation.reply)
        why = {"eos": "an end-of-sequence token", "length": "--max-new-tokens", "stopped": "a stop"}[generation.reason]
        print(f"({len(generation.prompt_ids)} prompt tokens, {generation.n_new} new, ended by {why})",
              file=sys.stderr)
    if written:
        print(f"wrote {written}", file=sys.stderr)
    return 0


def _generate(args: argparse.Namespace) -> tuple[Any, Any]:
    # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
    from model_core.generate.generation import DecodingOptions, generate
    from model_core.trace.request import TraceRequest
    from model_core.trace.resolve import resolve

    options = DecodingOptions(max_new_tokens=args.max_new_tokens, sample=args.sample, temperature=args.temperature,
                              top_p=args.top_p, seed=args.seed)
    resolved = resolve(TraceRequest("pretrained", "", model_id=args.model_id), device=args.device)
    return generate(resolved, args.prompt, chat=args.chat, options=options), resolved


def _write(generation: Any, resolved: Any, args: argparse.Namespace) -> str:
    """Trace the whole sequence through the one route and write it: full where its weights fit, else compact."""
    # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
    from model_core.compact.views import choose_form
    from model_core.generate.trace import compact_of
    from model_core.io.export import write_trace
    from model_core.trace.request import build_trace

    request = generation.request(resolved.loaded.source.model_id)
    config = resolved.model.config
    form = choose_form(resolved.family.n_layers(config), resolved.family.n_heads(config), len(generation.token_ids),
                       resolved.settings.full_trace_mb, can_compact=True)
    if not form.compact:
        trace = build_trace(request, device=resolved.device)
        return f"{write_trace(trace, args.out)} ({trace.n_tokens} tokens, reply from {trace.reply_start})"
    if not args.out.lower().endswith(".npz"):
        raise ValueError(f"{len(generation.token_ids)} tokens are traced in compact form, which is written as .npz; "
                         "name --out FILE.npz.")
    trace = compact_of(request, resolved)
    return f"{trace.save(args.out)} (compact, {trace.n_tokens} tokens, reply from {trace.reply_start})"
