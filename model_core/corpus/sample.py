"""A token sample of a corpus run: which tokens, and the on-disk arrays of their queries, keys and hidden states.

Every token (text id, position) gets a pseudo-random priority from a fixed hash; the sample is the ``cap``
tokens of lowest priority (bottom-k sampling). It is planned from the token counts alone, before the model
runs, so every engine and every resume picks the same tokens, and each shard writes its own rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

SAMPLE_DIR = "sample"
DEFAULT_CAP = 20_000
"""Tokens in the sample unless told otherwise: the command line's ``--sample-cap`` and the corpus page."""


def priorities(text_ids: np.ndarray, positions: np.ndarray, seed: int = 0) -> np.ndarray:
    """A uniform number in [0, 1) per (text id, position), the same on every machine (splitmix64).

    Shape: (token,) -> (token,) float64.
    """
    with np.errstate(over="ignore"):
        x = (np.asarray(text_ids, dtype=np.uint64) << np.uint64(20)) ^ np.asarray(positions, dtype=np.uint64)
        x = x + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


@dataclass(frozen=True, eq=False)
class SamplePlan:
    """The sampled tokens, sorted by (text id, position); a token's row in the arrays is its index here.

    Shape: text_id, position, token_id: (sample,).
    """

    text_id: np.ndarray
    position: np.ndarray
    token_id: np.ndarray

    def __len__(self) -> int:
        return len(self.text_id)

    def rows_for(self, first_id: int, end_id: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """text id -> (positions, rows) for the texts ``first_id <= id < end_id``."""
        lo, hi = np.searchsorted(self.text_id, [first_id, end_id])
        out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        ids = self.text_id[lo:hi]
        for text_id in np.unique(ids):
            where = np.nonzero(ids == text_id)[0] + lo
            out[int(text_id)] = (self.position[where], where)
        return out


def plan_sample(token_ids: dict[int, list[int]], cap: int, seed: int = 0) -> SamplePlan:
    """The ``cap`` tokens of lowest priority among all tokens of all texts (padding never counts).

    Args:
        token_ids: text id -> its token ids as the run encodes them (truncated; skipped texts left out).
    """
    if cap < 1:
        raise ValueError(f"The sample cap must be at least 1, got {cap}.")
    text_id = np.concatenate([np.full(len(v), k, dtype=np.int64) for k, v in token_ids.items()] or [np.zeros(0, np.int64)])
    position = np.concatenate([np.arange(len(v), dtype=np.int64) for v in token_ids.values()] or [np.zeros(0, np.int64)])
    tokens = np.concatenate([np.asarray(v, dtype=np.int64) for v in token_ids.values()] or [np.zeros(0, np.int64)])
    if len(text_id) > cap:
        keep = np.argpartition(priorities(text_id, position, seed), cap - 1)[:cap]
        text_id, position, tokens = text_id[keep], position[keep], tokens[keep]
    order = np.lexsort((position, text_id))
    return SamplePlan(text_id[order], position[order], tokens[order])


def array_path(run: Path, kind: str) -> Path:
    """``sample/queries.npy``, ``keys.npy`` (layer, sample, hidden) or ``hidden.npy`` (layer + 1, sample, hidden)."""
    return Path(run) / SAMPLE_DIR / f"{kind}.npy"


def create_arrays(run: Path, kinds: dict[str, tuple[int, ...]]) -> None:
    """Allocate each array (float16, zeros) on disk once; a resume keeps the rows already written."""
    for kind, shape in kinds.items():
        path = array_path(run, kind)
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npy")
        np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float16, shape=shape).flush()
        tmp.replace(path)


def write_rows(run: Path, kind: str, rows: np.ndarray, values: np.ndarray) -> None:
    """Write a shard's rows. Shape: values (layer, row, hidden)."""
    if len(rows) == 0:
        return
    arr = np.load(array_path(run, kind), mmap_mode="r+")
    arr[:, rows] = values
    arr.flush()
    del arr


def read_array(run: Path, kind: str) -> np.ndarray:
    """A sample array, memory-mapped read-only (a layer or head is read from disk when sliced)."""
    path = array_path(run, kind)
    if not path.exists():
        raise FileNotFoundError(path)
    return np.load(path, mmap_mode="r")
