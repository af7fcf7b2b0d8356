"""A corpus run folder in formats other tools read: manifest.json, head_stats.npz, texts.parquet/.

Layout::

    RUN/manifest.json              model, corpus hash, counts, timings, package versions, complete
    RUN/head_stats.npz             <stat>_mean, <stat>_std, <stat>_count (layer, head); n_texts; pattern_type
    RUN/texts.parquet/part-00000.parquet   one row per text: text_id, text_a, text_b, n_tokens,
                                   truncated, skipped, and per statistic a list of layer x head floats

``texts.parquet`` is a folder of parts (the Spark/Hive layout): ``pandas.read_parquet`` and
``pyarrow.parquet.read_table`` read it whole. Each part is written atomically once its shard is done,
so an interrupted run is a valid partial run.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from model_core.analysis.per_head import STAT_NAMES
from model_core.corpus.batches import ChunkResult
from model_core.corpus.stats import PatternRules, StatSums, pattern_types
from model_core.io.atomic import uninterrupted

FORMAT = "attention-explorer-corpus-run"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
HEAD_STATS = "head_stats.npz"
TEXTS = "texts.parquet"


class CorpusRunError(ValueError):
    """A run folder cannot be used as asked; the message says why and what to do."""


def package_versions() -> dict[str, str]:
    """Versions of the packages that shape the numbers."""
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "tokenizers", "numpy", "pyarrow"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def part_path(run: Path, index: int) -> Path:
    return run / TEXTS / f"part-{index:05d}.parquet"


def done_parts(run: Path) -> list[int]:
    """Indices of the shards whose part is written."""
    folder = run / TEXTS
    if not folder.is_dir():
        return []
    return sorted(int(p.stem.split("-")[1]) for p in folder.glob("part-*.parquet"))


def write_part(run: Path, result: ChunkResult, texts: list[tuple[str, str | None]]) -> None:
    """Write one shard's rows (atomically: a half-written part never has the final name)."""
    # pyarrow costs ~0.3 s to import: only the run folder's writers and readers pay it
    import pyarrow as pa
    import pyarrow.parquet as pq

    n, n_stats, n_layers, n_heads = result.stats.shape
    columns: dict[str, Any] = {
        "text_id": pa.array(result.text_ids, pa.int64()),
        "text_a": pa.array([a for a, _ in texts], pa.string()),
        "text_b": pa.array([b for _, b in texts], pa.string()),
        "n_tokens": pa.array(result.n_tokens, pa.int32()),
        "truncated": pa.array(result.truncated, pa.bool_()),
        "skipped": pa.array(result.skipped, pa.bool_()),
    }
    for s, name in enumerate(STAT_NAMES):
        flat = pa.array(result.stats[:, s].reshape(-1), pa.float32())
        columns[name] = pa.FixedSizeListArray.from_arrays(flat, n_layers * n_heads)
    table = pa.table(columns)
    table = table.replace_schema_metadata({"layer_head_shape": json.dumps([n_layers, n_heads])})
    target = part_path(run, result.index)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    with uninterrupted():
        pq.write_table(table, tmp)
        os.replace(tmp, target)


def read_part(path: Path, n_layers: int, n_heads: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(stats, columns) of one part: stats (text, stat, layer, head) float32; n_tokens, truncated, skipped."""
    import pyarrow.parquet as pq  # ~0.3 s to import: only a run folder's readers pay it

    table = pq.read_table(path, columns=[*STAT_NAMES, "n_tokens", "truncated", "skipped"])
    stats = np.stack([_list_column(table[name], n_layers, n_heads) for name in STAT_NAMES], axis=1)
    return stats, {k: table[k].to_numpy(zero_copy_only=False) for k in ("n_tokens", "truncated", "skipped")}


def _list_column(column, n_layers: int, n_heads: int) -> np.ndarray:
    flat = column.combine_chunks().flatten().to_numpy(zero_copy_only=False)
    return flat.reshape(-1, n_layers, n_heads)


def tally_parts(run: Path, n_layers: int, n_heads: int) -> tuple[StatSums, dict[str, int]]:
    """Re-add every written part, in shard order: the sums and counts a resume starts from."""
    sums = StatSums.zeros(n_layers, n_heads)
    counts = {"done": 0, "truncated": 0, "skipped": 0, "tokens": 0}
    for index in done_parts(run):
        stats, cols = read_part(part_path(run, index), n_layers, n_heads)
        kept = ~cols["skipped"]
        part = StatSums.zeros(n_layers, n_heads)
        part.add(stats[kept])
        sums = sums.merge(part)
        counts["done"] += len(kept)
        counts["truncated"] += int(cols["truncated"].sum())
        counts["skipped"] += int(cols["skipped"].sum())
        counts["tokens"] += int(cols["n_tokens"][kept].sum())
    return sums, counts


def write_head_stats(run: Path, sums: StatSums, rules: PatternRules) -> None:
    """head_stats.npz from the sums (atomically)."""
    mean, std = sums.mean(), sums.std()
    arrays: dict[str, np.ndarray] = {"n_texts": np.array(sums.n_texts, dtype=np.int64)}
    for s, name in enumerate(STAT_NAMES):
        arrays[f"{name}_mean"] = mean[s]
        arrays[f"{name}_std"] = std[s]
        arrays[f"{name}_count"] = sums.count[s].astype(np.int64)
        arrays[f"{name}_sum"] = sums.total[s]
        arrays[f"{name}_sumsq"] = sums.total_sq[s]
    arrays["pattern_type"] = pattern_types(mean, rules)
    tmp = run / (HEAD_STATS + ".tmp.npz")
    with uninterrupted():
        np.savez(tmp, **arrays)
        os.replace(tmp, run / HEAD_STATS)


def write_manifest(run: Path, manifest: dict[str, Any]) -> None:
    manifest = {**manifest, "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    tmp = run / (MANIFEST + ".tmp")
    with uninterrupted():
        tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False), encoding="utf-8")
        os.replace(tmp, run / MANIFEST)


def read_manifest(run: Path) -> dict[str, Any]:
    """The manifest of a run folder, checked to be ours and of this version.

    Raises:
        CorpusRunError: no manifest, not a corpus run, or made by another version.
    """
    path = Path(run) / MANIFEST
    if not path.is_file():
        raise CorpusRunError(f"{str(run)!r} is not a corpus run: it has no {MANIFEST}. Run "
                             "`python -m model_core corpus ... --out FOLDER` to make one.")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorpusRunError(f"{path} is damaged ({exc}); delete the folder and run the corpus again.") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CorpusRunError(f"{str(run)!r} holds some other tool's {MANIFEST}, not a corpus run of Attention Explorer.")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise CorpusRunError(f"{str(run)!r} was written in run format {version}; this version reads format "
                             f"{FORMAT_VERSION}. Run the corpus again to rebuild it.")
    return manifest


@dataclass(frozen=True, eq=False)
class CorpusRun:
    """A run folder, opened without recomputing anything.

    Attributes:
        path: the folder.
        manifest: its manifest.json.
        mean, std: corpus mean and population standard deviation over texts. Shape: (stat, layer, head).
        count: texts that define each statistic. Shape: (stat, layer, head).
        patterns: pattern type per head. Shape: (layer, head) str.
    """

    path: Path
    manifest: dict[str, Any]
    mean: np.ndarray
    std: np.ndarray
    count: np.ndarray
    patterns: np.ndarray
    _texts: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def n_texts(self) -> int:
        return int(self.manifest["counts"]["done"])

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.manifest["n_layers"]), int(self.manifest["n_heads"])

    def stat(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) of one statistic. Shape: (layer, head) each."""
        if name not in STAT_NAMES:
            raise ValueError(f"Unknown statistic {name!r}; use one of {', '.join(STAT_NAMES)}.")
        i = STAT_NAMES.index(name)
        return self.mean[i], self.std[i]

    def texts(self):
        """The per-text table (pandas), read once and kept."""
        if "table" not in self._texts:
            import pyarrow.parquet as pq  # ~0.3 s to import: only a run folder's readers pay it

            if not done_parts(self.path):
                raise CorpusRunError(f"{str(self.path)!r} has no texts yet.")
            self._texts["table"] = pq.read_table(self.path / TEXTS).sort_by("text_id")
        return self._texts["table"]

    def per_text(self, name: str, layer: int, head: int) -> tuple[np.ndarray, np.ndarray]:
        """(text ids, values) of one statistic of one head, over the texts that define it."""
        n_layers, n_heads = self.shape
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ValueError(f"layer {layer}, head {head} is out of range for this run ({n_layers} x {n_heads}).")
        table = self.texts()
        values = _list_column(table[name], n_layers, n_heads)[:, layer, head]
        ids = table["text_id"].to_numpy()
        keep = np.isfinite(values)
        return ids[keep], values[keep]

    def extremes(self, name: str, layer: int, head: int, k: int = 5) -> tuple[list[dict], list[dict]]:
        """The ``k`` texts where one head's statistic is highest, and the ``k`` where it is lowest."""
        ids, values = self.per_text(name, layer, head)
        order = np.argsort(values, kind="stable")
        table = self.texts()
        index_of = {int(t): i for i, t in enumerate(table["text_id"].to_numpy())}

        def row(j: int) -> dict:
            i = index_of[int(ids[j])]
            return {"text_id": int(ids[j]), "value": float(values[j]), "text_a": table["text_a"][i].as_py(),
                    "text_b": table["text_b"][i].as_py(), "n_tokens": int(table["n_tokens"][i].as_py())}

        return [row(j) for j in order[::-1][:k]], [row(j) for j in order[:k]]


def open_run(path: str | Path) -> CorpusRun:
    """Open a run folder made by ``run_corpus`` or the CLI (complete or partial).

    Raises:
        CorpusRunError: not a run folder, another version, or no statistics yet.
    """
    run = Path(path).expanduser()
    manifest = read_manifest(run)
    if not (run / HEAD_STATS).is_file():
        raise CorpusRunError(f"{str(path)!r} has no {HEAD_STATS} yet: no shard finished. Resume the run.")
    with np.load(run / HEAD_STATS) as data:
        mean = np.stack([data[f"{n}_mean"] for n in STAT_NAMES])
        std = np.stack([data[f"{n}_std"] for n in STAT_NAMES])
        count = np.stack([data[f"{n}_count"] for n in STAT_NAMES])
        patterns = data["pattern_type"].astype(str)
    return CorpusRun(run, manifest, mean, std, count, patterns)
