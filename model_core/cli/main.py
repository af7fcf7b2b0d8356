"""The command line's parser and dispatch: one verb a module in ``model_core.cli``."""

from __future__ import annotations

import argparse
import sys

from model_core.cli._common import add_dtype_to_model_verbs, apply_dtype
from model_core.cli.atlas import add_atlas_parser, atlas_main
from model_core.cli.attribute import add_attribute_parser, attribute_main
from model_core.cli.circuit import add_circuit_parser, circuit_main
from model_core.cli.composition import add_composition_parser, composition_main
from model_core.cli.corpus import add_corpus_parser, corpus_main
from model_core.cli.export import add_export_parser, export_main
from model_core.cli.generate import add_generate_parser, generate_main
from model_core.cli.graph import add_graph_parser, graph_main
from model_core.cli.kv import add_kv_parser, kv_main
from model_core.cli.models import add_models_parser, models_main
from model_core.cli.neighbours import add_neighbours_parser, neighbours_main
from model_core.cli.patch import add_patch_parser, patch_main
from model_core.cli.qk import add_qk_parser, qk_main
from model_core.cli.roles import add_roles_parser, roles_main
from model_core.cli.weights import add_weights_parser, weights_main

VERBS = {"export": export_main, "weights": weights_main, "roles": roles_main, "corpus": corpus_main,
         "models": models_main, "neighbours": neighbours_main, "graph": graph_main, "attribute": attribute_main,
         "patch": patch_main, "generate": generate_main, "kv": kv_main, "composition": composition_main, "qk": qk_main,
         "circuit": circuit_main, "atlas": atlas_main}


def build_parser() -> argparse.ArgumentParser:
    """Every verb's subparser, in the order ``--help`` lists them."""
    parser = argparse.ArgumentParser(prog="python -m model_core", description="Attention Explorer's model core.")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (add_export_parser, add_weights_parser, add_roles_parser, add_corpus_parser, add_models_parser,
                add_neighbours_parser, add_graph_parser, add_attribute_parser, add_patch_parser, add_generate_parser,
                add_kv_parser, add_composition_parser, add_qk_parser, add_circuit_parser, add_atlas_parser):
        add(sub)
    add_dtype_to_model_verbs(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and run its verb; the exit code (0, 1 error, 2 usage, 130 Ctrl-C)."""
    args = build_parser().parse_args(argv)
    apply_dtype(args)
    try:
        return VERBS[args.command](args)
    except (RuntimeError, MemoryError) as exc:  # torch's OutOfMemoryError is a RuntimeError
        # start-up time: building the parser imports neither torch nor transformers (tests/test_lazy_exports.py)
        from model_core.models.run_memory import after_out_of_memory, out_of_memory

        if not out_of_memory(exc):
            raise
        print(f"error: {after_out_of_memory(exc)}", file=sys.stderr)
        return 1
