"""Lazy public names for a package's ``__init__`` (PEP 562): a name's module is imported on its first use.

``import model_core`` and the command line's ``--help`` or a usage error then cost no torch or transformers import
(7 s on a 2-core machine), while ``from model_core import TraceRequest`` works as before.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, homes: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` whose public names live in ``homes`` (name -> module).

    A name is imported from its module on first use and kept in the package's namespace, so later uses are plain
    attribute reads. Any other name that is a subpackage or module of ``package`` is imported as such, as the eager
    ``__init__`` used to leave ``model_core.families`` and its siblings reachable after ``import model_core``.
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
                return importlib.import_module(f"{package}.{name}")  # the import sets the attribute
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__
