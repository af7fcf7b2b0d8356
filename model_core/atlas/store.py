"""An atlas folder: plain JSON and NPZ that other tools read.

Layout::

    ATLAS/manifest.json              model, corpus hash, options, counts, timings, complete, finished
    ATLAS/parts/part-00000.npz       one shard: text_ids, n_tokens, truncated, skipped, best_w/best_q/best_k
                                     (text, list, layer, head), sums (layer, head, profile), rows (3,)
    ATLAS/heads.json                 {"heads": [card, ...]}: every head's card, layer-major (written at the end)
    ATLAS/cards/L{layer}H{head}.json one head's card alone (written before heads.json), so that opening one head
                                     reads kilobytes, not every card

Each part is written atomically once its shard is done, so an interrupted atlas keeps every finished shard and a
rerun on the same model and texts continues from them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from model_core.atlas.keys import N_PROFILE
from model_core.io.atomic import uninterrupted

FORMAT = "attention-explorer-atlas"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
PARTS = "parts"
HEADS = "heads.json"
CARDS = "cards"
PART_ARRAYS = ("text_ids", "n_tokens", "truncated", "skipped", "best_w", "best_q", "best_k", "sums", "rows")
SHOW_KEYS = ("layer", "head", "summary", "top_contexts", "top_contexts_no_sink", "deciles", "profile", "qk",
             "copying_score", "promoted_tokens", "roles", "composition")
"""The keys of ``atlas --show --json``, in order."""


class AtlasRunError(ValueError):
    """An atlas folder cannot be used as asked; the message says why and what to do."""


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (a reader never sees half a file)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False, allow_nan=False), encoding="utf-8")
    os.replace(tmp, path)


def card_path(folder: Path, layer: int, head: int) -> Path:
    return Path(folder) / CARDS / f"L{layer}H{head}.json"


def write_cards(folder: Path, heads: list[dict[str, Any]]) -> None:
    """Every head's card in its own file, then all of them in ``HEADS`` (whose presence says the cards are done)."""
    (Path(folder) / CARDS).mkdir(exist_ok=True)
    for card in heads:
        write_json(card_path(folder, card["layer"], card["head"]), card)
    write_json(Path(folder) / HEADS, {"heads": heads})


def read_manifest(folder: Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    if not path.exists():
        raise AtlasRunError(f"{str(folder)!r} holds no atlas ({MANIFEST} is missing); run `python -m model_core atlas "
                            "... --out FOLDER` first.")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT:
        raise AtlasRunError(f"{str(folder)!r} is not an atlas folder (its manifest says {manifest.get('format')!r}).")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise AtlasRunError(f"{str(folder)!r} was written by another version of the atlas; run it again.")
    return manifest


def part_path(folder: Path, index: int) -> Path:
    return Path(folder) / PARTS / f"part-{index:05d}.npz"


def done_parts(folder: Path) -> list[int]:
    """Indices of the shards whose part is written."""
    parts = Path(folder) / PARTS
    return sorted(int(p.stem.split("-")[1]) for p in parts.glob("part-*.npz")) if parts.is_dir() else []


def write_part(folder: Path, result: Any) -> None:
    """One shard's arrays (``ShardResult``), atomically."""
    target = part_path(folder, result.index)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.stem + ".tmp.npz")
    with uninterrupted():
        np.savez_compressed(tmp, **{name: getattr(result, name) for name in PART_ARRAYS})
        os.replace(tmp, target)


@dataclass(frozen=True)
class Scanned:
    """Every finished shard joined, texts in id order.

    Shape: best_w (text, list, layer, head) float32; best_q, best_k the same, int32; sums (layer, head, profile)
    float64; rows (3,); text_ids, n_tokens, truncated, skipped (text,).
    """

    text_ids: np.ndarray
    n_tokens: np.ndarray
    truncated: np.ndarray
    skipped: np.ndarray
    best_w: np.ndarray
    best_q: np.ndarray
    best_k: np.ndarray
    sums: np.ndarray
    rows: np.ndarray


def read_parts(folder: Path, n_layers: int, n_heads: int) -> Scanned:
    """Join every written part (an empty atlas has no texts)."""
    arrays: dict[str, list[np.ndarray]] = {name: [] for name in PART_ARRAYS}
    for index in done_parts(folder):
        with np.load(part_path(folder, index)) as data:
            for name in PART_ARRAYS:
                arrays[name].append(data[name])
    if not arrays["text_ids"]:
        empty = np.zeros((0, 2, n_layers, n_heads))
        return Scanned(np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, bool), np.zeros(0, bool),
                       empty.astype(np.float32), empty.astype(np.int32), empty.astype(np.int32),
                       np.zeros((n_layers, n_heads, N_PROFILE)), np.zeros(3, np.int64))
    per_text = {name: np.concatenate(arrays[name]) for name in PART_ARRAYS if name not in ("sums", "rows")}
    order = np.argsort(per_text["text_ids"], kind="stable")
    return Scanned(**{name: a[order] for name, a in per_text.items()}, sums=np.sum(arrays["sums"], axis=0),
                   rows=np.sum(arrays["rows"], axis=0))


@dataclass
class AtlasRun:
    """An atlas folder opened for reading: its manifest and, once finished, every head's card."""

    path: Path
    manifest: dict[str, Any]
    _heads: list[dict[str, Any]] | None = field(default=None, repr=False)

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.manifest["n_layers"]), int(self.manifest["n_heads"])

    @property
    def complete(self) -> bool:
        """Every text scanned and every card written."""
        return bool(self.manifest.get("complete")) and bool(self.manifest.get("finished"))

    @property
    def heads(self) -> list[dict[str, Any]]:
        """Every head's card, layer-major.

        Raises:
            AtlasRunError: the atlas has no cards yet (interrupted before its end); the message says to rerun.
        """
        if self._heads is None:
            path = self.path / HEADS
            if not path.exists():
                raise AtlasRunError(f"{str(self.path)!r} is a partial atlas (no {HEADS} yet): run the same command "
                                    "again to continue it.")
            self._heads = json.loads(path.read_text(encoding="utf-8"))["heads"]
        return self._heads

    def card(self, layer: int, head: int) -> dict[str, Any]:
        """One head's card.

        Raises:
            ValueError: a head that does not exist; the message names the valid range.
        """
        n_layers, n_heads = self.shape
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ValueError(f"Head {layer}.{head} does not exist: this atlas has layers 0..{n_layers - 1} and heads "
                             f"0..{n_heads - 1} (write --head L.H).")
        if self._heads is None and (self.path / HEADS).exists():
            own = card_path(self.path, layer, head)
            if own.exists():  # an atlas written before the per-head files reads heads.json
                return json.loads(own.read_text(encoding="utf-8"))
        return self.heads[layer * n_heads + head]

    def show(self, layer: int, head: int) -> dict[str, Any]:
        """The ``atlas --show --json`` object: exactly ``SHOW_KEYS``."""
        card = self.card(layer, head)
        return {key: card[key] for key in SHOW_KEYS}


def open_atlas(folder: str | Path) -> AtlasRun:
    """Open an atlas folder (complete or partial).

    Raises:
        AtlasRunError: no atlas there, or one of another format version.
    """
    folder = Path(folder).expanduser()
    return AtlasRun(folder, read_manifest(folder))
