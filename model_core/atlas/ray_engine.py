"""The atlas's Ray engine: the same per-shard function as the local engine (``process_shard``), one Ray task per
shard, on corpus mode's Ray connection and its one loaded model per worker (``model_core.corpus.ray_engine``).

The cards (the QK split, the logit effects, the weight-only parts) run in the driver on its own copy of the model:
they read a few hundred texts at most, while the scan reads them all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from model_core.atlas.shard import ShardResult, process_shard
from model_core.corpus.model import CorpusModel
from model_core.corpus.ray_engine import _connect, _remote, _worker_model  # one connection, one model per worker


def _shard_task(model: CorpusModel, index: int, first: int, texts: list, options: dict) -> ShardResult:
    return process_shard(_worker_model(model), index, first, texts, **options)


def run_shards_on_ray(model: CorpusModel, shards: list[tuple[int, int, list]], options: Any,
                      address: str | None = None, num_cpus: int | None = None) -> Iterator[ShardResult]:
    """Yield each shard's result as it finishes; at most two shards in flight per worker slot. Closing the generator
    (Ctrl-C, a Stop) cancels the shards still running."""
    ray = _connect(address, num_cpus)
    task = _remote(ray, _shard_task)
    slots = max(1, int(ray.cluster_resources().get("GPU", 0) or ray.cluster_resources().get("CPU", 1)))
    opts = {"batch_size": options.batch_size, "max_tokens": options.max_tokens, "long": options.long}
    model_ref = ray.put(model)
    pending: list[Any] = []
    queue = list(shards)
    try:
        while queue or pending:
            while queue and len(pending) < 2 * slots:
                index, first, texts = queue.pop(0)
                pending.append(task.remote(model_ref, index, first, texts, opts))
            ready, pending = ray.wait(pending, num_returns=1)
            yield ray.get(ready[0])
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
