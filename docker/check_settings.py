"""Print the deployment's settings, or exit 2 with the message of the first bad AE_* variable.

Loads ``model_core/settings.py`` by file path, not through the package, so the check does not pay
for importing torch at every container start.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SETTINGS_FILE = Path(__file__).resolve().parent.parent / "model_core" / "settings.py"


def main() -> int:
    spec = importlib.util.spec_from_file_location("_ae_settings", SETTINGS_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while building the class
    spec.loader.exec_module(module)
    try:
        settings = module.load_settings()
    except ValueError as error:
        print(f"Attention Explorer: bad setting: {error}", file=sys.stderr)
        return 2
    print(f"Attention Explorer settings: {settings}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
