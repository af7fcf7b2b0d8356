"""The Ray engine for edge attribution: the batches go to Ray tasks, each runs the local engine's ``score_batch`` on
its worker's own copy of the model, and the per-pair sums come back to be combined into the same mean over pairs.

Ray is optional (requirements-dev.txt installs it); ``model_core.corpus.ray_engine`` starts or joins the cluster.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from model_core.circuits.eap import BatchScores, CircuitModel, PairBatch, score_batch
from model_core.circuits.loading import load_circuit_model

# One model per worker process and model id: a worker scores many batches and loads once.
_WORKER_MODELS: dict[str | None, CircuitModel] = {}


def _worker_model(model_id: str | None) -> CircuitModel:
    if model_id not in _WORKER_MODELS:
        _WORKER_MODELS[model_id] = load_circuit_model(model_id, device="cpu")
    return _WORKER_MODELS[model_id]


def _score_task(model_id: str | None, index: int, batch: PairBatch, steps: int, threads: int) -> tuple[int,
                                                                                                        BatchScores]:
    torch.set_num_threads(max(1, threads))
    return index, score_batch(_worker_model(model_id), batch, steps)


def score_on_ray(model_id: str | None, batches: Sequence[PairBatch], steps: int, *, address: str | None = None,
                 num_cpus: int | None = None) -> Iterator[BatchScores]:
    """Yield each batch's sums in batch order (a batch that finishes early waits for those before it, so a Stop keeps
    a prefix of the pairs, as the local engine does). Closing the generator cancels the batches still running.

    Raises:
        ValueError: Ray is not installed, or the cluster cannot be reached.
    """
    from model_core.corpus.ray_engine import (
        _connect,  # Ray is optional: imported only for --engine ray
    )

    ray = _connect(address, num_cpus)
    slots = max(1, int(ray.cluster_resources().get("CPU", 1)))
    task = ray.remote(num_cpus=1, max_retries=2)(_score_task)
    pending: list[Any] = []
    queue = list(enumerate(batches))
    ready_by_index: dict[int, BatchScores] = {}
    next_index = 0
    try:
        while queue or pending:
            while queue and len(pending) < 2 * slots:
                index, batch = queue.pop(0)
                pending.append(task.remote(model_id, index, batch, steps, 1))
            ready, pending = ray.wait(pending, num_returns=1)
            index, got = ray.get(ready[0])
            ready_by_index[index] = got
            while next_index in ready_by_index:
                yield ready_by_index.pop(next_index)
                next_index += 1
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
