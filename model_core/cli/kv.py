"""PLACEHOLDER: the `kv` verb, being built; replaced before landing."""

from __future__ import annotations

import argparse


def add_kv_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("kv", help="(being built)")


def kv_main(args: argparse.Namespace) -> int:
    raise SystemExit("python -m model_core kv is being built.")
