"""Nearest contexts (exBERT): per layer, a cosine index of the token sample's hidden states, and the search.

Exact search is FAISS's inner product on L2-normalised vectors (``IndexFlatIP``); past ``IVF_FROM``
tokens an inverted-file index (``IndexIVFFlat``) answers approximately, and ``bench/bench_index.py``
measures its recall against the exact one.
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from model_core.corpus.sample import read_array

INDEX_DIR = "index"
IVF_FROM = 1_000_000
IVF_NPROBE = 32


def _faiss() -> Any:
    try:
        import faiss  # optional engine, loaded by the neighbour search alone; its absence says what to install
    except ImportError:
        raise ValueError("Nearest contexts need FAISS: pip install faiss-cpu (it is in requirements.txt).") from None
    return faiss


def normalised(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), float32. Shape: (n, d)."""
    v = np.ascontiguousarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    return v / np.where(norms > 0, norms, 1.0)


def build_index(vectors: np.ndarray, *, ivf_from: int = IVF_FROM, seed: int = 0) -> Any:
    """A cosine index of ``vectors``: exact below ``ivf_from`` rows, IVF (approximate) from there.

    Shape: vectors (n, d).
    """
    faiss = _faiss()
    v = normalised(vectors)
    n, d = v.shape
    if n < ivf_from:
        index = faiss.IndexFlatIP(d)
    else:
        nlist = int(4 * math.sqrt(n))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(seed)
        train = v[rng.choice(n, size=min(n, 64 * nlist), replace=False)]
        index.train(train)
        index.nprobe = IVF_NPROBE
    index.add(v)
    return index


def index_path(run: Path, layer: int) -> Path:
    return Path(run) / INDEX_DIR / f"layer_{layer:02d}.faiss"


def build_indexes(run: Path, *, ivf_from: int = IVF_FROM) -> dict[str, Any]:
    """One index per hidden layer (0 = the embeddings) of the run's sample; returns what the manifest records."""
    faiss = _faiss()
    hidden = read_array(run, "hidden")  # (layer + 1, sample, hidden)
    start = time.perf_counter()
    (Path(run) / INDEX_DIR).mkdir(exist_ok=True)
    size = 0
    for layer in range(hidden.shape[0]):
        index = build_index(np.asarray(hidden[layer]), ivf_from=ivf_from)
        path = index_path(run, layer)
        faiss.write_index(index, str(path.with_suffix(".tmp")))
        path.with_suffix(".tmp").replace(path)
        size += path.stat().st_size
    return {"kind": "flat" if hidden.shape[1] < ivf_from else "ivf", "layers": int(hidden.shape[0]),
            "tokens": int(hidden.shape[1]), "bytes": size, "seconds": round(time.perf_counter() - start, 3)}


@functools.lru_cache(maxsize=32)
def load_index(path: str, stamp: float) -> Any:
    """An index read from disk once per file version (``stamp``: its mtime)."""
    return _faiss().read_index(path)


def search(run: Path, layer: int, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, sample rows) of the ``k`` nearest sample tokens to ``vector`` at ``layer``, best first.

    Shape: vector (hidden,) -> (k,), (k,).
    """
    path = index_path(run, layer)
    index = load_index(str(path), path.stat().st_mtime)
    scores, rows = index.search(normalised(np.asarray(vector)[None]), k)
    keep = rows[0] >= 0
    return scores[0][keep], rows[0][keep]


def brute_force(vectors: np.ndarray, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The same top-k with numpy alone (the reference the tests compare FAISS against)."""
    sims = normalised(vectors) @ normalised(np.asarray(vector)[None])[0]
    order = np.argsort(-sims, kind="stable")[:k]
    return sims[order], order
