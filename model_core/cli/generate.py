"""PLACEHOLDER: the `generate` verb, being built; replaced before landing."""

from __future__ import annotations

import argparse


def add_generate_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("generate", help="(being built)")


def generate_main(args: argparse.Namespace) -> int:
    raise SystemExit("python -m model_core generate is being built.")
