"""Options and checks that several verbs share: the model choice and the chapter-3 encoder's shape."""

from __future__ import annotations

import argparse
import sys
from typing import Any

MODEL_CHOICES = ["pretrained", "custom", "bert"]
NOT_PRETRAINED = "error: --causal and --weights apply to --model custom only; a pretrained model has its own mask"


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
