"""``--run-memory-mb``: the verbs that run a model (circuit, patch, qk, generate, corpus, roles) take the same memory
limit as the app (``AE_RUN_MEMORY_MB``, ``model_core.models.run_memory``), and this flag raises or lowers it for one
command."""

from __future__ import annotations

import argparse
import os
from typing import Any

HELP = ("the most memory, in MB, the run may take above the model (default: AE_RUN_MEMORY_MB, a quarter of the "
        "machine's memory); a run estimated over it is refused before it starts, with the estimate")


def megabytes(raw: str) -> float:
    """A limit in MB above 0 (argparse's type: a bad one is a usage error that names the flag)."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number of MB (e.g. 12000)") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{raw!r} is not above 0 MB")
    return value


def add_run_memory_flag(parser: Any) -> None:
    """Add ``--run-memory-mb MB`` to a verb's parser."""
    parser.add_argument("--run-memory-mb", type=megabytes, default=None, metavar="MB", help=HELP)


def apply_run_memory_flag(args: argparse.Namespace) -> None:
    """Make ``--run-memory-mb`` this process's ``AE_RUN_MEMORY_MB``, which every run's check reads."""
    value = getattr(args, "run_memory_mb", None)
    if value is None:
        return
    os.environ["AE_RUN_MEMORY_MB"] = repr(float(value))  # the command is its own process: its settings read this
