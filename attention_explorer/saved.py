"""Save a whole AttentionTrace to one .npz file and load it back, every field as it was.

``model_core.io.export`` writes the documented export keys for other tools; this keeps every field of the
trace (values, value norms, logits, the head mask...), so that a loaded trace draws and analyses exactly
as the one that was saved.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import numpy as np

from model_core.trace.trace import AttentionTrace

FORMAT = "attention-explorer-trace/1"
# Fields that are not arrays: kept in one JSON document inside the file.
_META = ("tokens", "sentence_b_start", "model_kind", "causal", "description", "score_scale", "score_softcap",
         "special_tokens", "next_token_strings", "reply_start")


def save_trace(trace: AttentionTrace, path: str | Path) -> Path:
    """Write ``trace`` to ``path`` (a .npz file, compressed); return the path written."""
    path = Path(path)
    if path.suffix != ".npz":
        raise ValueError(f"{path} must end in .npz: a saved trace is a numpy archive.")
    meta = {name: getattr(trace, name) for name in _META}
    meta["tokens"] = list(trace.tokens)
    meta["special_tokens"] = sorted(trace.special_tokens)
    meta["format"] = FORMAT
    arrays = {f.name: np.asarray(getattr(trace, f.name)) for f in fields(trace)
              if f.name not in _META and getattr(trace, f.name) is not None}
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, _meta=np.array(json.dumps(meta)), **arrays)
    return path


def load_trace(path: str | Path) -> AttentionTrace:
    """Read a trace written by ``save_trace``.

    Raises:
        ValueError: the file is not a saved trace (for instance an export of ``python -m model_core export``).
    """
    with np.load(Path(path), allow_pickle=False) as archive:
        if "_meta" not in archive.files:
            raise ValueError(f"{path} is not a trace saved by Trace.save (no _meta entry); an export made with "
                             "`attention-explorer export` holds arrays only: read it with numpy.load.")
        meta = json.loads(str(archive["_meta"]))
        arrays = {name: archive[name] for name in archive.files if name != "_meta"}
    if meta.pop("format", None) != FORMAT:
        raise ValueError(f"{path} was saved in another format than {FORMAT}.")
    meta["tokens"] = tuple(meta["tokens"])
    meta.setdefault("reply_start", None)  # files saved before generation have none
    meta["special_tokens"] = frozenset(meta["special_tokens"])
    if meta["next_token_strings"] is not None:
        meta["next_token_strings"] = tuple(tuple(row) for row in meta["next_token_strings"])
    return AttentionTrace(**meta, **arrays)
