"""Test helper: read back the parameters a bertviz view carries, as its page's script will."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from attention_explorer import views as bv


def decode_params(view: bv.BertvizView) -> dict[str, Any]:
    """The parameters bertviz's script will read, decoded in Python as ``aeExpand`` does in JS.

    The weights as floats, the pair blocks as full copies: what the tests check the views against.
    """
    marker = "window.bertviz_params = " if view.kind == "neuron" else "const params = "
    at = view.html.index(marker) + len(marker) + len("aeExpand(")
    params, _ = json.JSONDecoder().raw_decode(view.html, at)
    entries = params["attention"] if isinstance(params["attention"], list) else list(params["attention"].values())
    full = entries[0]
    for key in ("attn", "queries", "keys"):
        if isinstance(full.get(key), dict):  # packed weights: little-endian uint16 in base64
            packed = np.frombuffer(base64.b64decode(full[key]["ae_b64"]), dtype="<u2").reshape(full[key]["shape"])
            full[key] = (packed / bv.SCALE).tolist()
        elif key in full:
            full[key] = (np.asarray(full[key], dtype=np.float64) / bv.SCALE).tolist()
    for entry in entries[1:]:
        r0, r1, c0, c1 = entry["attn"]["ae_block"]
        entry["attn"] = np.asarray(full["attn"])[:, :, r0:r1, c0:c1].tolist()
        if "queries" in full:
            entry["queries"] = np.asarray(full["queries"])[:, :, r0:r1].tolist()
            entry["keys"] = np.asarray(full["keys"])[:, :, c0:c1].tolist()
    return params
