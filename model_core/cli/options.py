"""Options and checks that several verbs share: the model choice and the chapter-3 encoder's shape."""

from __future__ import annotations

import argparse
import sys
from typing import Any

MODEL_CHOICES = ["pretrained", "custom", "bert"]
NOT_PRETRAINED = "error: --causal and --weights apply to --model custom only; a pretrained model has its own mask"


def add_model_options(parser: Any, model_help: str, id_help: str, *, required: bool = True) -> None:
    """``--model`` (one of ``MODEL_CHOICES``; default "pretrained" where not ``required``) and ``--model-id``."""
    parser.add_argument("--model", choices=MODEL_CHOICES, required=required,
                        default=None if required else "pretrained", help=model_help)
    parser.add_argument("--model-id", default=None, help=id_help)


def model_verb(sub: Any, name: str, help_text: str, model_help: str, id_help: str, *, required: bool = True) -> Any:
    """A verb's subparser with ``add_model_options``; returns it for the verb's own options."""
    parser = sub.add_parser(name, help=help_text)
    add_model_options(parser, model_help, id_help, required=required)
    return parser


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
