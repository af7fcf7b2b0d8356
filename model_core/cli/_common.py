"""What the verbs that run a model share: the subparser with ``--model`` and ``--model-id`` first, and the trace
request of a verb with the chapter-3 encoder's options."""

from __future__ import annotations

import argparse
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


def custom_trace_request(args: argparse.Namespace, text: str) -> TraceRequest:
    """The ``TraceRequest`` of ``text`` for a verb with ``add_model_options`` and ``add_custom_options``."""
    # Start-up time: loaded when the verb runs, not for --help, as it imports torch and transformers.
    from model_core.trace.request import TraceRequest

    return TraceRequest(args.model, text, model_id=args.model_id, **custom_request_fields(args))
