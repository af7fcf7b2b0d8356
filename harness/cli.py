"""The command line run in this process: ``run_cli(*argv)`` is ``python -m model_core *argv`` without a new
interpreter, for the tests of what a verb says and does (its messages, exit codes, JSON).

A fresh ``python -m model_core`` imports torch and transformers and loads its model again: 4 s on a quiet machine,
10-16 s on a loaded CI worker, for each call. The tests that read the CLI's messages and refusals run it here; each
verb keeps at least one test through a real process (``python -m model_core``), which checks the entry point, the
exit status and that stdout holds nothing but the JSON.

A verb's settings are the process's (``--dtype`` and ``--run-memory-mb`` write ``AE_DTYPE`` and
``AE_RUN_MEMORY_MB``; ``atlas --threads`` sets torch's threads): they are put back after each call, so one call's
flags never reach the next test.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess

import torch


def run_cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m model_core *argv`` in this process, with ``env`` added to the environment for the call; its exit
    code and what it printed, as ``subprocess.run`` would give them (``args``, ``returncode``, ``stdout``,
    ``stderr``). A usage error is argparse's exit 2 and its message, as from a process."""
    # The CLI's entry point, imported at the call: a test module that never calls it does not load the verbs
    from model_core.cli.main import main

    saved_env, threads = dict(os.environ), torch.get_num_threads()
    out, err = io.StringIO(), io.StringIO()
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exc:  # argparse's usage errors and --help
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if isinstance(exc.code, str):
                    print(exc.code, file=err)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess(["model_core", *argv], int(code or 0), out.getvalue(), err.getvalue())
