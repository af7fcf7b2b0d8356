"""What the verbs that run a model share: the subparser with ``--model`` and ``--model-id`` first, and the trace
request of a verb with the chapter-3 encoder's options."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from model_core.cli.options import (
    MODEL_ID_HELP,
    add_model_options,
    custom_request_fields,
)

if TYPE_CHECKING:  # the request imports torch: loaded when a verb runs, not for --help
    from model_core.trace.request import TraceRequest


def model_verb_parser(sub: Any, name: str, verb_help: str, model_help: str,
                      id_help: str = MODEL_ID_HELP + " (default: the bundled BERT)") -> argparse.ArgumentParser:
    """Add the verb ``name`` to the subparsers ``sub``, with ``--model`` and ``--model-id`` (``add_model_options``);
    returns its parser for the verb's own options."""
    parser = sub.add_parser(name, help=verb_help)
    add_model_options(parser, model_help, id_help)
    return parser


DTYPES = ("auto", "float32", "bfloat16", "float16")  # model_core.settings.DTYPE_CHOICES, without importing it here


def add_dtype_options(parser: argparse.ArgumentParser) -> None:
    """``--dtype``: the model's precision for this run (AE_DTYPE), on every verb that loads a model."""
    parser.add_argument("--dtype", default=None, choices=DTYPES,
                        help="the model's precision: auto (float32 on a CPU; bfloat16 on a GPU for a model over 1B "
                             "parameters), float32, bfloat16 or float16; attention weights stay float32 "
                             "(default: AE_DTYPE, else auto)")


def add_dtype_to_model_verbs(sub: Any) -> None:
    """``add_dtype_options`` on every verb of the subparsers ``sub`` that takes ``--device`` (the verbs that load a
    model), so no verb is left out."""
    for parser in sub.choices.values():
        if "--device" in parser._option_string_actions and "--dtype" not in parser._option_string_actions:
            add_dtype_options(parser)


def apply_dtype(args: argparse.Namespace) -> None:
    """A verb's ``--dtype`` as the process's AE_DTYPE: one run of the command line is one process, and every load
    in it (the route, circuits, Ray workers started from it) reads the precision from the settings."""
    if getattr(args, "dtype", None):
        os.environ["AE_DTYPE"] = args.dtype


def custom_trace_request(args: argparse.Namespace, text: str) -> TraceRequest:
    """The ``TraceRequest`` of ``text`` for a verb with ``add_model_options`` and ``add_custom_options``."""
    # Start-up time: loaded when the verb runs, not for --help, as it imports torch and transformers.
    from model_core.trace.request import TraceRequest

    return TraceRequest(args.model, text, model_id=args.model_id, **custom_request_fields(args))
