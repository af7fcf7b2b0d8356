"""PLACEHOLDER: the `attribute` verb, being built; replaced before landing."""

from __future__ import annotations

import argparse


def add_attribute_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("attribute", help="(being built)")


def attribute_main(args: argparse.Namespace) -> int:
    raise SystemExit("python -m model_core attribute is being built.")
