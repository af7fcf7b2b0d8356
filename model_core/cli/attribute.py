"""The ``attribute`` verb: direct logit attribution of a decoder's next-token logit at one position.

``python -m model_core attribute --model pretrained --model-id ID --text TEXT [--answer STR] [--foil STR | --no-foil]
[--position I] --json`` prints {"tokens", "answer_id", "foil_id", "logit", "embed", "heads": L×H, "mlps": [L], "rest",
"position", "parts_sum", "mlps_run"} (and a "note" for a model with a final-logit softcap). The answer defaults to
the model's top prediction and the foil to the runner-up (the top prediction when the answer is the runner-up), as on
the page: the logit difference is split; ``--no-foil`` splits the answer's logit itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from model_core.cli._common import model_verb_parser

RUNNER_UP = "runner-up"


def add_attribute_parser(sub: Any) -> None:
    """Add the ``attribute`` verb to the command line's subparsers."""
    att = model_verb_parser(sub, "attribute", "split a decoder's next-token logit (or a logit difference) into each "
                            "head's, MLP's and the embedding's direct effect",
                            "pretrained: a decoder language model (GPT-2 or Llama-like); an encoder has no logit",
                            "hub id, folder, or bundled:SmolLM2-135M-Instruct")
    att.add_argument("--text", required=True, help="the text; the logit is the next token's after --position")
    att.add_argument("--answer", default=None,
                     help="the answer token as written, leading space included (\" Paris\"); default: the model's "
                          "top prediction")
    foil = att.add_mutually_exclusive_group()
    foil.add_argument("--foil", default=None,
                      help=f"a token whose logit is subtracted (\" London\"); default: {RUNNER_UP!r}, the model's "
                           "second prediction (its first when the answer is the second)")
    foil.add_argument("--no-foil", action="store_true", help="split the answer's logit itself, with no foil")
    att.add_argument("--position", type=int, default=-1, help="the position to read (default -1: the last token)")
    att.add_argument("--device", default=None, help="auto, cpu, cuda or mps")
    att.add_argument("--json", action="store_true", help="print JSON")


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


def run_attribute(args: argparse.Namespace) -> Any:
    """Trace the text once and attribute its logit (``model_core.effects.attribution``); a text over the full trace's
    limit takes one compact pass that keeps the last position's z and residual stream instead.

    Raises:
        ValueError: an encoder, a text that cannot be traced, an answer or foil that is not one token.
    """
    # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
    from model_core.effects.attribution import (
        NotADecoder,
        attribute,
        token_id_of,
        top_two,
    )
    from model_core.effects.attribution_long import attribute_last, last_position_pass
    from model_core.families.checks import require_decoder
    from model_core.trace.forward import check_full_size, trace_model
    from model_core.trace.request import TraceRequest
    from model_core.trace.resolve import resolve

    if args.model == "custom":
        raise NotADecoder("The chapter-3 encoder has no next-token logit, so direct logit attribution needs a "
                          "decoder (--model pretrained --model-id bundled:SmolLM2-135M-Instruct). For an encoder "
                          "use `python -m model_core graph`.")
    request = TraceRequest(args.model, args.text, model_id=args.model_id)
    resolved = resolve(request, device=args.device)
    require_decoder(resolved.family, "direct logit attribution",
                    instead="Pass one with --model-id; for an encoder use `python -m model_core graph`.")
    encoded = resolved.encode(request)
    family, model, n = resolved.family, resolved.model, encoded.input_ids.shape[1]
    pick = lambda text, fallback: fallback if text is None else token_id_of(resolved.tokenizer, text)

    def foil_of(answer: int, top: int, second: int) -> int | None:
        if args.no_foil:
            return None
        if args.foil is None or args.foil == RUNNER_UP:
            return second if second != answer else top
        return pick(args.foil, None)

    try:
        check_full_size(family.n_layers(model.config), family.n_heads(model.config), n)
    except ValueError:  # a long text: one more pass keeps what the last position needs
        if args.position not in (-1, n - 1):
            raise ValueError(f"This text of {n} tokens is over the full trace's limit (AE_FULL_TRACE_MB), and past "
                             "it only the last position is attributed: leave out --position.") from None
        last = last_position_pass(family, model, encoded.input_ids[0].numpy())
        top, second = (int(i) for i in last.top_ids[:2])
        answer = pick(args.answer, top)
        return attribute_last(family, model, encoded.input_ids[0].numpy(), encoded.tokens, answer,
                              foil_of(answer, top, second), last=last), resolved.tokenizer
    trace = trace_model(family, model, encoded, resolved.description, tokenizer=resolved.tokenizer)
    top, second = top_two(trace, args.position)
    answer = pick(args.answer, top)
    return attribute(trace, model, family, answer, foil_of(answer, top, second), args.position), resolved.tokenizer


def _lines(result: Any, tokenizer: Any) -> list[str]:
    """A few lines for people: what is split, the check, the biggest parts."""
    name = lambda i: repr(tokenizer.decode([i]))
    what = f"logit({name(result.answer_id)})" + ("" if result.foil_id is None else f" - logit({name(result.foil_id)})")
    lines = [f"{what} after token {result.position} ({result.tokens[result.position]!r}): {result.logit:.4f}",
             (f"parts sum to {result.total:.4f}: embed {result.embed:.4f}, heads {result.heads.sum():.4f}, "
              f"MLPs {result.mlps.sum():.4f}, rest {result.rest:.4f}")]
    for sign, label in ((1, "towards"), (-1, "against")):
        top = ", ".join(f"L{la}H{h} {v:+.3f}" for la, h, v in result.top_heads(5, sign))
        lines.append(f"heads {label}: {top or '(none)'}")
    mlp = ", ".join(f"L{la} {result.mlps[la]:+.3f}" for la in (-abs(result.mlps)).argsort()[:5])
    lines.append(f"largest MLPs: {mlp}")
    if result.final_softcap is not None:
        lines.append(f"(before the model's final-logit softcap of {result.final_softcap:g})")
    return lines


def attribute_main(args: argparse.Namespace) -> int:
    """The ``attribute`` verb: JSON (``--json``) or a few lines; exit 1 with one line on bad input."""
    try:
        result, tokenizer = run_attribute(args)
    except (ValueError, OSError) as exc:  # NotADecoder, NotOneToken, InputError and ModelLoadError are ValueErrors
        return _error(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    if args.json:
        print(json.dumps(result.to_json()))
        return 0
    print("\n".join(_lines(result, tokenizer)))
    return 0
