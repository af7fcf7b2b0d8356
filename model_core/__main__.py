"""``python -m model_core`` and the ``attention-explorer`` command: ``export`` writes a trace, ``weights`` a window of a
compact one; ``corpus`` runs a corpus into a run folder, ``neighbours`` searches one; ``models`` lists the bundled
models and the supported families; ``roles`` scores what each head does. Each verb is a module of ``model_core.cli``."""

from __future__ import annotations

import sys

from model_core.cli.main import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
