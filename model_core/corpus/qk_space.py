"""The query–key space of a head (AttentionViz, Yeh et al. 2023): the sample's queries and keys in one
joint 2-D embedding, after the key translation and norm scaling that make nearness reflect q·k.

* **Key translation**: k' = k − mean(k) + mean(q). For a fixed query the scores q·k' differ from q·k by
  the same constant for every key, so the softmax (the attention) is unchanged, and the two clouds share
  one centroid instead of sitting apart.
* **Norm scaling**: q' = c·q, k' = k/c with c = √(mean‖k‖ / mean‖q‖), so both clouds have the same mean
  norm; q'·k' = q·k.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from model_core.corpus.sample import read_array

METHODS = ("pca", "umap", "tsne")


def head_vectors(run: Path, layer: int, head: int, n_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """The sample's queries and keys of one head, float32. Shape: (sample, d_head) each."""
    queries, keys = read_array(run, "queries"), read_array(run, "keys")
    n_layers, _, hidden = queries.shape
    if not 0 <= layer < n_layers:
        raise ValueError(f"Layer {layer} does not exist: this run's model has layers 0-{n_layers - 1}.")
    if not 0 <= head < n_heads:
        raise ValueError(f"Head {head} does not exist: this run's model has heads 0-{n_heads - 1}.")
    d = hidden // n_heads
    cols = slice(head * d, (head + 1) * d)
    return np.asarray(queries[layer, :, cols], dtype=np.float32), np.asarray(keys[layer, :, cols], dtype=np.float32)


def translate_keys(queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Keys moved so that their centroid is the queries' centroid. Shape: (n, d) -> (n, d)."""
    return keys - keys.mean(axis=0) + queries.mean(axis=0)


def scale_norms(queries: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(c·q, k/c) with equal mean norms; every dot product q·k is unchanged."""
    q_norm = float(np.linalg.norm(queries, axis=1).mean())
    k_norm = float(np.linalg.norm(keys, axis=1).mean())
    if q_norm == 0 or k_norm == 0:
        return queries, keys
    c = np.sqrt(k_norm / q_norm)
    return queries * c, keys / c


def pca_2d(points: np.ndarray) -> np.ndarray:
    """The first two principal components, signs fixed (largest loading positive): deterministic.

    Shape: (n, d) -> (n, 2).
    """
    centred = points - points.mean(axis=0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    axes = vt[:2]
    signs = np.sign(axes[np.arange(len(axes)), np.abs(axes).argmax(axis=1)])
    coords = centred @ (axes * signs[:, None]).T
    return coords if coords.shape[1] == 2 else np.pad(coords, ((0, 0), (0, 2 - coords.shape[1])))


def cache_compiled(package: str) -> None:
    """Keep the machine code numba compiles for ``package``'s functions on disk, as ``cache=True`` would.

    umap-learn compiles about a hundred functions at its first fit in a process, 18 s on two cores, and asks numba
    to cache only one of them: every new server (or CLI run) paid the 18 s again, and a Stop waits for it. With its
    functions' caches on, a later process loads them in 0.7 s (a 300-point fit, 29 Nov). numba writes the cache next
    to the package's source, or in the user's cache folder where that is read-only; a function it cannot cache is
    compiled as before (numba warns)."""
    from numba.core.dispatcher import Dispatcher  # numba comes with umap-learn: only a UMAP view reaches here

    for name, module in list(sys.modules.items()):
        if name != package and not name.startswith(package + "."):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, Dispatcher) and type(value._cache).__name__ == "NullCache":
                value.enable_caching()


def project(points: np.ndarray, method: str = "pca", seed: int = 0) -> np.ndarray:
    """2-D coordinates of ``points`` by PCA (default), UMAP or t-SNE, seeded. Shape: (n, d) -> (n, 2)."""
    if method == "pca":
        return pca_2d(points)
    if method == "umap":
        try:
            import umap  # optional engine (requirements-dev), seconds to import: only the UMAP view loads it
        except ImportError:
            raise ValueError("UMAP needs umap-learn: pip install umap-learn (in requirements-dev.txt); "
                             "PCA needs nothing.") from None
        cache_compiled("umap")
        return umap.UMAP(n_components=2, random_state=seed, n_neighbors=15).fit_transform(points)
    if method == "tsne":
        try:
            from sklearn.manifold import TSNE  # optional engine, slow to import: only the t-SNE view loads it
        except ImportError:
            raise ValueError("t-SNE needs scikit-learn: pip install scikit-learn; PCA needs nothing.") from None
        return TSNE(n_components=2, random_state=seed, init="pca").fit_transform(points)
    raise ValueError(f"Unknown projection {method!r}; use one of {', '.join(METHODS)}.")


@dataclass(frozen=True, eq=False)
class JointProjection:
    """Queries and keys of one head in one 2-D space.

    Shape: coords (2 * n, 2): the n queries, then the n keys; rows (2 * n,): the sample row of each point.
    """

    coords: np.ndarray
    is_key: np.ndarray
    rows: np.ndarray
    method: str


def joint_projection(queries: np.ndarray, keys: np.ndarray, *, method: str = "pca", seed: int = 0,
                     limit: int | None = None) -> JointProjection:
    """Translate the keys, scale the norms, and project both clouds together.

    ``limit`` projects a seeded subsample of that many tokens (the grid of a whole layer uses it).
    """
    n = len(queries)
    rows = np.arange(n)
    if limit is not None and n > limit:
        rows = np.sort(np.random.default_rng(seed).choice(n, size=limit, replace=False))
        queries, keys = queries[rows], keys[rows]
    q, k = scale_norms(queries, translate_keys(queries, keys))
    coords = project(np.concatenate([q, k]), method, seed)
    return JointProjection(np.asarray(coords, dtype=np.float32),
                           np.repeat([False, True], len(rows)), np.concatenate([rows, rows]), method)
