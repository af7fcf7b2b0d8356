"""PLACEHOLDER: the `graph` verb, being built; replaced before landing."""

from __future__ import annotations

import argparse


def add_graph_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("graph", help="(being built)")


def graph_main(args: argparse.Namespace) -> int:
    raise SystemExit("python -m model_core graph is being built.")
