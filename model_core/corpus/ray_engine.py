"""The Ray engine: the same per-shard function as the local engine, one Ray task per shard.

Ray is optional (it is not in the app image); ``requirements-dev.txt`` installs it. On a machine
with GPUs each task asks for one, and the worker runs its batches there.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from model_core.corpus.batches import ChunkResult, process_chunk
from model_core.corpus.model import CorpusModel, LoadedCorpusModel

# One loaded model per worker process and model: a worker runs many shards and loads once.
_WORKER_MODELS: dict[CorpusModel, LoadedCorpusModel] = {}


def _ray() -> Any:
    try:
        import ray  # optional engine (requirements-dev), seconds to import: only --engine ray loads it
    except ImportError:
        raise ValueError("--engine ray needs Ray: pip install 'ray[default]' (it is in requirements-dev.txt), "
                         "or use --engine local.") from None
    return ray


REACH_S = 5.0
"""How long a cluster's address may take to answer a TCP connection before the run is refused (Ray's own client
retries an address that does not answer for about half a minute)."""


def _check_reachable(address: str) -> None:
    """Refuse at once an address ``host:port`` (or ``ray://host:port``) where nothing answers; other forms ("auto",
    a cluster found by Ray's own means) are left to Ray."""
    found = re.fullmatch(r"(?:ray://)?\[?([^\]\s]+?)\]?:(\d+)", address.strip())
    if found is None:
        return
    try:
        socket.create_connection((found.group(1), int(found.group(2))), timeout=REACH_S).close()
    except OSError as exc:
        raise ValueError(f"Could not reach the Ray cluster at {address!r} ({exc}; waited up to {REACH_S:.0f} s). "
                         "Start one with `ray start --head`, or leave out --ray-address for a local "
                         "instance.") from None


def _connect(address: str | None, num_cpus: int | None) -> Any:
    """Join the cluster at ``address``, or start a local Ray instance; ship model_core to the workers."""
    ray = _ray()
    if not ray.is_initialized():
        package = str(Path(__file__).resolve().parents[1])
        kwargs: dict[str, Any] = {"runtime_env": {"py_modules": [package]}, "include_dashboard": False,
                                  "log_to_driver": False, "configure_logging": False}
        if address:
            _check_reachable(address)
            kwargs["address"] = address
        elif num_cpus:
            kwargs["num_cpus"] = num_cpus
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ValueError(f"Could not reach the Ray cluster at {address!r} ({exc}). Start one with "
                             "`ray start --head`, or leave out --ray-address for a local instance.") from None
    return ray


def _worker_model(model: CorpusModel) -> LoadedCorpusModel:
    if model not in _WORKER_MODELS:
        ray = _ray()
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
        torch.set_num_threads(max(1, int(cpus)))
        _WORKER_MODELS[model] = model.load()  # cuda when Ray gave this task a GPU
    return _WORKER_MODELS[model]


def _shard_task(fn: Any, model: CorpusModel, index: int, first: int, texts: list, options: dict) -> Any:
    return fn(_worker_model(model), index, first, texts, **options)


def _describe_task(model: CorpusModel) -> tuple[int, int, str, str, int, int]:
    loaded = _worker_model(model)
    return (loaded.n_layers, loaded.n_heads, loaded.description, str(loaded.device), loaded.max_positions,
            loaded.hidden_size)


def _remote(ray: Any, fn: Any) -> Any:
    gpus = ray.cluster_resources().get("GPU", 0)
    return ray.remote(num_gpus=1 if gpus else 0, num_cpus=1, max_retries=2)(fn)


def describe_remote(model: CorpusModel, address: str | None,
                    num_cpus: int | None) -> tuple[int, int, str, str, int, int]:
    """(layers, heads, description, device, max positions, hidden size) as a worker sees the model (and a check that workers can load it)."""
    ray = _connect(address, num_cpus)
    return ray.get(_remote(ray, _describe_task).remote(model))


def map_shards(fn: Any, model: CorpusModel, shards: list[tuple[int, int, list]], options: dict,
               address: str | None = None, num_cpus: int | None = None,
               extra_for: Any = None) -> Iterator[Any]:
    """``fn(loaded, index, first, texts, **options, **extra_for(first, end))`` for each shard, one Ray task a shard on
    the worker's one loaded model; yield each result as it finishes, at most two shards in flight per worker slot.

    The corpus scan and the atlas's scan both run through it. Closing the generator (Ctrl-C, a cancelled run)
    cancels the shards still running.
    """
    ray = _connect(address, num_cpus)
    task = _remote(ray, _shard_task)
    slots = max(1, int(ray.cluster_resources().get("GPU", 0) or ray.cluster_resources().get("CPU", 1)))
    model_ref = ray.put(model)
    pending: list[Any] = []
    queue = list(shards)
    try:
        while queue or pending:
            while queue and len(pending) < 2 * slots:
                index, first, texts = queue.pop(0)
                extra = extra_for(first, first + len(texts)) if extra_for is not None else {}
                pending.append(task.remote(fn, model_ref, index, first, texts, {**options, **extra}))
            ready, pending = ray.wait(pending, num_returns=1)
            yield ray.get(ready[0])
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)


def run_shards_on_ray(model: CorpusModel, shards: list[tuple[int, int, list]], options: Any,
                      address: str | None = None, num_cpus: int | None = None,
                      sample_for: Any = None) -> Iterator[ChunkResult]:
    """The corpus scan's shards on Ray (``map_shards`` of ``process_chunk``); ``sample_for(first, end)`` is the
    shard's sample of keys to keep, or None."""
    opts = {"batch_size": options.batch_size, "max_tokens": options.max_tokens, "long": options.long,
            "qk": options.keep_qk, "hidden": options.index}
    extra_for = None if sample_for is None else (lambda first, end: {"sample": sample_for(first, end)})
    yield from map_shards(process_chunk, model, shards, opts, address, num_cpus, extra_for)
