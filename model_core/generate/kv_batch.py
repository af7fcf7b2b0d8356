"""Many budgets of one text in one pass: the compressed caches of several ratios padded into a batch, and the
budget sweep built on it.

A single-token pass reads every weight of the model once, whatever its cache; on a CPU that read is most of its
cost. The sweep therefore runs each policy's nine budgets as one batch: each batch row holds one budget's
compressed cache, padded at the end to the longest, with a padding mask that hides the padding (every key/value
head of a row keeps the same number of keys, so one mask a row suffices), the last token at its true position n − 1
in every row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache

from model_core.generate.kv import (
    RATIOS,
    KVPlan,
    Prefill,
    Progress,
    gather_rows,
    kl_nats,
    retained_shares,
)
from model_core.generate.presses import check_ratio, kept_positions


def padded_cache(pre: Prefill, kept: Sequence[np.ndarray]) -> tuple[Any, torch.Tensor]:
    """A batch of compressed caches, one row per kept set, padded at the end; and the padding mask of the cache
    plus one token (1 = a key to attend to, the new token's included).

    Shape: kept: each (layer, kv_head, k_b) int64 -> cache layers (batch, kv_head, max k_b, d_head), mask
    (batch, max k_b + 1) long.
    """
    lengths = [k.shape[-1] for k in kept]
    longest, batch = max(lengths), len(kept)
    n_layers, n_kv = kept[0].shape[:2]
    index = np.zeros((n_layers, batch, n_kv, longest), dtype=np.int64)  # padding reads position 0, masked out
    for b, positions in enumerate(kept):
        index[:, b, :, : lengths[b]] = positions
    cache = DynamicCache()
    for layer, (k, v) in enumerate(zip(pre.keys, pre.values)):
        rows = gather_rows(index[layer], k.shape[2], k.device)
        cache.update(k[0].flatten(0, 1).index_select(0, rows).view(batch, n_kv, longest, k.shape[-1]),
                     v[0].flatten(0, 1).index_select(0, rows).view(batch, n_kv, longest, v.shape[-1]), layer)
    mask = torch.zeros(batch, longest + 1, dtype=torch.long, device=pre.keys[0].device)
    for b, length in enumerate(lengths):
        mask[b, :length] = 1
    mask[:, -1] = 1
    return cache, mask


def step_batch(family: Any, model: Any, tokens: torch.Tensor, cache: Any, mask: torch.Tensor,
               position: int) -> tuple[torch.Tensor, Any]:
    """One token per batch row on a padded cache, at ``position`` in every row: (next-token logits, the cache).

    Shape: tokens (batch,) long, mask (batch, cache + 1) -> logits (batch, vocab).
    """
    ids = tokens[:, None]
    positions = torch.full_like(ids, position)
    out = family.forward(model, ids, torch.zeros_like(ids), mask, vectors=False, hidden=False, logits=True,
                         past=cache, position_ids=positions)
    return out.lm_logits[:, -1], out.past


def batch_log_probs(family: Any, model: Any, pre: Prefill, kept: Sequence[np.ndarray]) -> np.ndarray:
    """The last token's next-token log-probabilities on each kept set's compressed cache, in one pass.

    Shape: kept: each (layer, kv_head, k_b) -> (batch, vocab) float64.
    """
    cache, mask = padded_cache(pre, kept)
    tokens = torch.full((len(kept),), int(pre.token_ids[-1]), device=mask.device)
    logits, _ = step_batch(family, model, tokens, cache, mask, len(pre.token_ids) - 1)
    return torch.log_softmax(logits.double(), dim=-1).cpu().numpy()


@dataclass(frozen=True, eq=False)
class KVSweep:
    """KL(full ‖ compressed) and top-token changes for each policy at each ratio.

    Attributes:
        presses, ratios: the grid's rows and columns.
        kl: nats; NaN where a ratio keeps no key. Shape: (press, ratio).
        top_changed: Shape: (press, ratio) bool.
        retained: the mean retained share over heads. Shape: (press, ratio).
    """

    presses: tuple[str, ...]
    ratios: tuple[float, ...]
    kl: np.ndarray
    top_changed: np.ndarray
    retained: np.ndarray

    def to_rows(self) -> list[dict[str, Any]]:
        """One row per (press, ratio), for a CSV."""
        return [{"press": p, "compression_ratio": r, "next_token_kl": float(self.kl[i, j]),
                 "top_token_changed": bool(self.top_changed[i, j]), "mean_retained": float(self.retained[i, j])}
                for i, p in enumerate(self.presses) for j, r in enumerate(self.ratios)]


def sweep(plan: KVPlan, family: Any, model: Any, presses: Sequence[str] | None = None,
          ratios: Sequence[float] = RATIOS, progress: Progress | None = None) -> KVSweep:
    """Every planned policy at every ratio: one batched single-token pass per policy.

    Raises:
        ValueError: a ratio outside (0, 1), or a policy the plan did not score.
    """
    presses = tuple(plan.orders) if presses is None else tuple(presses)
    missing = [p for p in presses if p not in plan.orders]
    if missing:
        raise ValueError(f"{', '.join(missing)} were not scored for this text; plan them first.")
    ratios = tuple(float(check_ratio(r)) for r in ratios)
    pre = plan.prefill
    shape = (len(presses), len(ratios))
    kl, changed, retained = np.full(shape, np.nan), np.zeros(shape, dtype=bool), np.full(shape, np.nan)
    top_full = int(np.argmax(pre.full_log_probs))
    budgets = [(j, int(pre.n_prefill * (1 - r))) for j, r in enumerate(ratios)]
    budgets = [(j, k) for j, k in budgets if k >= 1]  # a ratio that keeps no key stays NaN
    for i, press in enumerate(presses):
        kept = [kept_positions(plan.orders[press], k) for _, k in budgets]
        if kept:
            log_q = batch_log_probs(family, model, pre, kept)
            for (j, _), row, positions in zip(budgets, log_q, kept):
                kl[i, j] = kl_nats(pre.full_log_probs, row)
                changed[i, j] = int(np.argmax(row)) != top_full
                retained[i, j] = retained_shares(pre.last_row, positions, pre.kv_heads).mean()
        if progress is not None:
            progress(i + 1, len(presses))
    return KVSweep(presses, ratios, kl, changed, retained)
