"""KV-cache compression policies ("presses", kvpress's word): each scores the prefill's keys, per key/value head,
and a cache keeps the best-scored ones.

Each policy follows kvpress 0.5.5 (NVIDIA), which follows its paper, with kvpress's defaults:

- ``streaming_llm`` (Xiao et al. 2023): the first ``N_SINK`` = 4 keys (attention sinks) and the most recent ones.
- ``knorm`` (Devoto et al. 2024): the keys of lowest L2 norm (after the rotary embedding, as the cache holds them).
- ``snapkv`` (Li et al. 2024): the attention of the last ``WINDOW`` = 64 prefill queries on the keys before them
  (softmax over every key the query sees, the window's own included), averaged over those queries, smoothed by a
  1-D average pool over key positions (kernel ``KERNEL`` = 5, padding 2, the padding counted as zeros, as torch's
  ``avg_pool1d``), then averaged over each key/value head's query heads. The window's keys are always kept.
- ``tova`` (Oren et al. 2024): the last prefill query's attention averaged over all query heads, so one kept set
  per layer shared by every key/value head; the last prefill key is always kept.
- ``observed_attention`` (H2O-style, Zhang et al. 2023): each key's attention summed over all prefill queries,
  divided by how many queries see it (n_prefill − j under a causal mask), averaged over each key/value head's
  query heads.

A policy keeps ``n_kept(n_prefill, ratio)`` = int(n_prefill · (1 − ratio)) keys per key/value head, computed in
floating point as kvpress does (so 100 keys at 0.9 keep 9). Scores give an order of the keys that does not depend
on the ratio (``key_order``): a budget sweep scores once and takes prefixes. Ties go to the later position (kvpress
leaves them to ``torch.topk``; they matter only inside SnapKV's window when the budget is smaller than it).
The scores read attention through an ``AttentionSource`` (``model_core.generate.kv_sources``): the prefill pass's
own queries and keys, a full trace's weights or a compact trace's queries and keys.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

PRESSES: tuple[str, ...] = ("streaming_llm", "knorm", "snapkv", "tova", "observed_attention")
"""The policies, by kvpress's names (``ui.fields.PRESSES`` lists the same)."""
PRESS_TITLES = {"streaming_llm": "StreamingLLM", "knorm": "Knorm", "snapkv": "SnapKV", "tova": "TOVA",
                "observed_attention": "Observed attention (H2O)"}
N_SINK = 4
"""StreamingLLM's attention sinks: the first keys, always kept."""
WINDOW = 64
"""SnapKV's observation window: the last prefill queries whose attention scores the keys."""
KERNEL = 5
"""SnapKV's pooling kernel over key positions."""
ROW_BLOCK = 512
"""Query rows read at once for observed attention: a block is (head, ROW_BLOCK, n_prefill) floats."""


class AttentionSource(Protocol):
    """Where the prefill's attention comes from (``model_core.generate.kv_sources``).

    Attributes:
        n_layers, n_heads, n_prefill: the prefill's shape (every token but the last).
        kv_heads: the key/value head each query head reads. Shape: (head,) int64.
    """

    n_layers: int
    n_heads: int
    n_prefill: int
    kv_heads: np.ndarray

    def rows(self, layer: int, r0: int, r1: int, c1: int | None = None) -> np.ndarray:
        """The prefill's attention weights of queries r0:r1 on keys 0:c1 (default: every prefill key), as the
        prefill pass computes them (softmax over the prefill's keys). Shape: -> (head, r1 - r0, c1) float64."""
        ...

    def column_sums(self, layer: int, block: int) -> np.ndarray:
        """Each prefill key's weight summed over every prefill query, read ``block`` rows at a time.
        Shape: -> (head, n_prefill) float64."""
        ...

    def keys(self, layer: int) -> np.ndarray:
        """The key/value heads' keys of the prefill. Shape: -> (kv_head, n_prefill, d_head) float32."""
        ...


def check_press(press: str) -> str:
    """``press`` if it is a policy.

    Raises:
        ValueError: it is not one of ``PRESSES``; the message lists them.
    """
    if press not in PRESSES:
        raise ValueError(f"Unknown compression policy {press!r}; choose one of {', '.join(PRESSES)}.")
    return press


def check_ratio(ratio: float) -> float:
    """``ratio`` as a float if it lies in (0, 1).

    Raises:
        ValueError: it does not; the message says what the ratio means.
    """
    r = float(ratio)
    if not (math.isfinite(r) and 0.0 < r < 1.0):
        raise ValueError(f"The compression ratio is the share of the prefill's keys dropped, strictly between 0 and "
                         f"1 (0.5 keeps half); got {ratio!r}.")
    return r


def n_kept(n_prefill: int, ratio: float) -> int:
    """How many keys a key/value head keeps, counted as kvpress counts them: int(n_prefill · (1 − ratio)).

    Raises:
        ValueError: the ratio is outside (0, 1), or keeps no key at all (the message gives the largest that keeps one).
    """
    kept = int(n_prefill * (1 - check_ratio(ratio)))
    if kept < 1:
        raise ValueError(f"A ratio of {ratio} keeps no key of these {n_prefill} prefill tokens; use a ratio below "
                         f"{1 - 1 / n_prefill:.3f} or a longer text.")
    return kept


def snapkv_window(n_prefill: int) -> int:
    """SnapKV's window for a prefill of ``n_prefill`` tokens: ``WINDOW``, or half the prefill when it has no more
    than ``WINDOW`` tokens (kvpress refuses such short inputs; here the first half is scored by the second)."""
    return WINDOW if n_prefill > WINDOW else max(1, n_prefill // 2)


def _group_mean(per_head: np.ndarray, kv_heads: np.ndarray) -> np.ndarray:
    """Average a per-query-head score over each key/value head's query heads. Shape: (head, k) -> (kv_head, k)."""
    n_kv = int(kv_heads.max()) + 1
    return np.stack([per_head[kv_heads == g].mean(0) for g in range(n_kv)])


def _avg_pool(x: np.ndarray, kernel: int) -> np.ndarray:
    """A 1-D average pool along the last axis, stride 1, ``kernel // 2`` zeros of padding each side, each window
    divided by ``kernel`` (torch's ``avg_pool1d`` with ``count_include_pad=True``). Shape: (..., k) -> (..., k)."""
    pad = kernel // 2
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)])
    sums = np.cumsum(np.pad(padded, [(0, 0)] * (x.ndim - 1) + [(1, 0)]), axis=-1)
    return (sums[..., kernel:] - sums[..., :-kernel]) / kernel


def streaming_llm_scores(source: AttentionSource) -> np.ndarray:
    """The sinks first (in order), then every other key by recency. Shape: -> (layer, kv_head, n_prefill)."""
    n = source.n_prefill
    pos = np.arange(n, dtype=np.float64)
    score = np.where(pos < N_SINK, 2.0 * n - pos, pos)
    n_kv = int(source.kv_heads.max()) + 1
    return np.broadcast_to(score, (source.n_layers, n_kv, n)).copy()


def knorm_scores(source: AttentionSource) -> np.ndarray:
    """Minus each key's L2 norm: the smallest norms score highest. Shape: -> (layer, kv_head, n_prefill)."""
    return np.stack([-np.linalg.norm(source.keys(layer).astype(np.float64), axis=-1)
                     for layer in range(source.n_layers)])


def snapkv_scores(source: AttentionSource) -> np.ndarray:
    """The window's pooled attention per key/value head; the window's keys above every other key.

    Shape: -> (layer, kv_head, n_prefill).
    """
    n = source.n_prefill
    window = snapkv_window(n)
    scored = n - window
    out = []
    for layer in range(source.n_layers):
        weights = source.rows(layer, scored, n)[:, :, :scored]  # (head, window, scored): softmax over all n keys
        pooled = _avg_pool(weights.mean(1), KERNEL)  # (head, scored)
        grouped = _group_mean(pooled, source.kv_heads)
        top = grouped.max() + 1 if grouped.size else 1.0  # as kvpress: the window above every scored key
        out.append(np.concatenate([grouped, np.full((len(grouped), window), top)], axis=1))
    return np.stack(out)


def tova_scores(source: AttentionSource) -> np.ndarray:
    """The last prefill query's attention averaged over every query head, the same for each key/value head; the
    last prefill key above every other. Shape: -> (layer, kv_head, n_prefill)."""
    n = source.n_prefill
    n_kv = int(source.kv_heads.max()) + 1
    out = []
    for layer in range(source.n_layers):
        row = source.rows(layer, n - 1, n)[:, 0, : n - 1].mean(0)  # (n - 1,)
        top = row.max() + 1 if row.size else 1.0
        out.append(np.broadcast_to(np.append(row, top), (n_kv, n)))
    return np.stack(out)


def observed_attention_scores(source: AttentionSource) -> np.ndarray:
    """Each key's attention summed over the prefill's queries, over how many queries see it (n_prefill − j),
    averaged over each key/value head's query heads. Streams over blocks of ``ROW_BLOCK`` query rows.

    Shape: -> (layer, kv_head, n_prefill).
    """
    n = source.n_prefill
    seen_by = np.arange(n, 0, -1, dtype=np.float64)
    return np.stack([_group_mean(source.column_sums(layer, ROW_BLOCK) / seen_by, source.kv_heads)
                     for layer in range(source.n_layers)])


SCORERS = {"streaming_llm": streaming_llm_scores, "knorm": knorm_scores, "snapkv": snapkv_scores,
           "tova": tova_scores, "observed_attention": observed_attention_scores}


def press_scores(source: AttentionSource, press: str) -> np.ndarray:
    """The scores ``press`` gives every prefill key; higher is kept first. Shape: -> (layer, kv_head, n_prefill).

    Raises:
        ValueError: an unknown press.
    """
    return SCORERS[check_press(press)](source)


def key_order(scores: np.ndarray) -> np.ndarray:
    """Each key/value head's keys from the best score down, ties to the later position: a budget of k keeps the
    first k. Shape: (layer, kv_head, n_prefill) -> the same, int64 positions."""
    n = scores.shape[-1]
    flat = scores.reshape(-1, n)
    later_first = -np.arange(n)
    order = np.stack([np.lexsort((later_first, -row)) for row in flat])
    return order.reshape(scores.shape).astype(np.int64)


def kept_positions(order: np.ndarray, kept: int) -> np.ndarray:
    """The positions a budget of ``kept`` keys keeps, ascending. Shape: (layer, kv_head, n_prefill) ->
    (layer, kv_head, kept) int64."""
    return np.sort(order[..., :kept], axis=-1)
