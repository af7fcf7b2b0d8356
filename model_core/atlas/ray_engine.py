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
from model_core.corpus.ray_engine import map_shards


def run_shards_on_ray(model: CorpusModel, shards: list[tuple[int, int, list]], options: Any,
                      address: str | None = None, num_cpus: int | None = None) -> Iterator[ShardResult]:
    """Yield each shard's result as it finishes (``map_shards`` of ``process_shard``); closing the generator
    (Ctrl-C, a Stop) cancels the shards still running."""
    opts = {"batch_size": options.batch_size, "max_tokens": options.max_tokens, "long": options.long}
    yield from map_shards(process_shard, model, shards, opts, address, num_cpus)
