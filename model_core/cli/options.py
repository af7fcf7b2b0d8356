"""Options and checks that several verbs share: the model choice and the chapter-3 encoder's shape."""

from __future__ import annotations

import argparse
import sys
from typing import Any

MODEL_CHOICES = ["pretrained", "custom", "bert"]
NOT_PRETRAINED = "error: --causal and --weights apply to --model custom only; a pretrained model has its own mask"


MODEL_ID_HELP = "hub id, folder, or a bundled id such as bundled:SmolLM2-135M-Instruct"


def add_model_options(parser: Any, model_help: str, id_help: str = MODEL_ID_HELP + " (default: the bundled BERT)"
                      ) -> None:
    """``--model`` (pretrained, custom, bert) and ``--model-id``, with what they mean for this verb."""
    parser.add_argument("--model", choices=MODEL_CHOICES, required=True, help=model_help)
    parser.add_argument("--model-id", default=None, help=id_help)


def add_custom_options(parser: Any) -> None:
    """The chapter-3 encoder's ``--weights``, ``--weights-seed``, ``--norm-placement`` and shape."""
    parser.add_argument("--weights", choices=["random", "pretrained"], default="random", help="custom encoder only")
    parser.add_argument("--weights-seed", type=int, default=0, help="custom encoder with random weights only")
    parser.add_argument("--norm-placement", choices=["pre", "post"], default="pre",
                        help="custom encoder with random weights only: LayerNorm before attention or after the sum")
    add_encoder_shape_options(parser)


def add_encoder_shape_options(parser: Any) -> None:
    """``--layers``, ``--heads``, ``--hidden``: the shape of a chapter-3 encoder with random weights."""
    parser.add_argument("--layers", type=int, default=12, help="custom encoder with random weights only")
    parser.add_argument("--heads", type=int, default=12, help="custom encoder with random weights only")
    parser.add_argument("--hidden", type=int, default=768, help="custom encoder with random weights only")


def custom_options_misused(args: argparse.Namespace) -> bool:
    """True (after the one-line error) when --causal or --weights is given for a pretrained model."""
    if args.model != "custom" and (args.causal or args.weights != "random"):
        print(NOT_PRETRAINED, file=sys.stderr)
        return True
    return False


def print_error(exc: BaseException) -> int:
    """The one-line ``error: ...`` on stderr a verb prints for bad input; returns the exit status, 1."""
    message = str(exc).strip().splitlines()
    print(f"error: {message[0]}" if message else f"error: {type(exc).__name__}", file=sys.stderr)
    return 1


def custom_request_fields(args: argparse.Namespace) -> dict:
    """The ``TraceRequest`` fields ``add_custom_options`` reads (the chapter-3 encoder's weights and shape)."""
    return {"weights": args.weights, "seed": args.weights_seed, "norm_placement": args.norm_placement,
            "num_hidden_layers": args.layers, "num_attention_heads": args.heads, "hidden_size": args.hidden}
