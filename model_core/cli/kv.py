"""The ``kv`` verb: ``python -m model_core kv --model pretrained --model-id ID --text TEXT --press NAME
--compression-ratio R [--json]``: what a compressed KV cache keeps of the text and what it costs
(``model_core.generate.kv``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from model_core.cli.options import MODEL_CHOICES
from model_core.generate.presses import PRESSES, check_ratio


def add_kv_parser(sub: Any) -> None:
    """Add the ``kv`` verb to the command line's subparsers."""
    kv = sub.add_parser("kv", help="compress a decoder's KV cache of a text with a policy (StreamingLLM, Knorm, "
                                   "SnapKV, TOVA, observed attention): the kept keys, the retained attention and "
                                   "the next-token KL")
    kv.add_argument("--model", choices=MODEL_CHOICES, default="pretrained",
                    help="pretrained: a decoder (a KV cache needs one); custom: refused, it is an encoder")
    kv.add_argument("--model-id", default=None, help="hub id, folder or bundled id of a decoder, e.g. "
                                                     "bundled:SmolLM2-135M-Instruct")
    kv.add_argument("--text", required=True, help="the text: every token but the last is prefilled and compressed")
    kv.add_argument("--press", choices=PRESSES, required=True, help="the compression policy (kvpress's names)")
    kv.add_argument("--compression-ratio", type=float, required=True,
                    help="the share of the prefill's keys dropped, in (0, 1): 0.75 keeps a quarter")
    kv.add_argument("--device", default=None, help="auto, cpu, cuda or mps")
    kv.add_argument("--json", action="store_true",
                    help='print {"kept": L x KVH lists of positions, "next_token_kl": nats, "retained": L x H, ...}')


def kv_main(args: argparse.Namespace) -> int:
    """The ``kv`` verb: JSON (``--json``) or a few lines."""
    try:
        check_ratio(args.compression_ratio)
    except ValueError as exc:
        print(f"error: --compression-ratio: {exc}", file=sys.stderr)
        return 2
    if args.model == "custom":
        print("error: the chapter-3 encoder has no KV cache (an encoder reads the whole text at once and generates "
              "nothing); use --model pretrained with a decoder such as bundled:SmolLM2-135M-Instruct", file=sys.stderr)
        return 1
    try:
        result = run_kv(args)
    except (ValueError, OSError) as exc:  # InputError and ModelLoadError are ValueErrors
        print(f"error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.to_json()))
        return 0
    print(f"{result.press} at compression ratio {result.ratio}: {result.n_kept} of {result.n_prefill} prefill keys "
          "kept per key/value head")
    print(f"next-token KL(full || compressed) = {result.next_token_kl:.6g} nats; top token "
          f"{result.text_full!r} ({result.p_full:.3f}) -> {result.text_compressed!r} ({result.p_compressed:.3f})"
          + (" CHANGED" if result.top_changed else ""))
    print(f"retained attention of the last token: mean {result.retained.mean():.4f}, lowest "
          f"{result.retained.min():.4f} over {result.retained.size} heads")
    for note in result.notes:
        print(f"note: {note}")
    return 0


def run_kv(args: argparse.Namespace):
    """Resolve the model, tokenise the text and compress (``model_core.generate.kv.kv_compress``)."""
    # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
    from model_core.generate.kv import kv_compress
    from model_core.trace.request import TraceRequest
    from model_core.trace.resolve import resolve

    request = TraceRequest("pretrained", args.text, model_id=args.model_id)
    resolved = resolve(request, device=args.device)
    if not resolved.family.is_decoder:
        raise ValueError(f"{resolved.description} is an encoder: it has no KV cache (it reads the whole text at once "
                         "and generates nothing). Use a decoder such as bundled:SmolLM2-135M-Instruct.")
    encoded = resolved.encode(request)
    return kv_compress(resolved.family, resolved.model, encoded.input_ids[0].numpy(), args.press,
                       args.compression_ratio, tokenizer=resolved.tokenizer)
