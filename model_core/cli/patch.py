"""PLACEHOLDER: the `patch` verb, being built; replaced before landing."""

from __future__ import annotations

import argparse


def add_patch_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("patch", help="(being built)")


def patch_main(args: argparse.Namespace) -> int:
    raise SystemExit("python -m model_core patch is being built.")
