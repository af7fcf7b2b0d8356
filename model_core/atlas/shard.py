"""One shard of an atlas run: tokenise its texts as corpus mode does, run padded length-sorted batches through the
model's one forward pass, and keep each text's best pairs and the profile sums (``model_core.atlas.scan``).

``process_shard`` is the pure per-shard function both engines call (locally, or in a Ray worker).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.atlas.keys import LISTS, N_PROFILE
from model_core.atlas.scan import BatchMasks, BatchScan, batch_scan, layer_scan, merge_blocks
from model_core.atlas.store import Scanned
from model_core.compact.build import layer_masks_of
from model_core.compact.trace import QUERY_BLOCK
from model_core.corpus.batches import DEFAULT_CELL_BUDGET, LongPolicy, pad_batch, plan_batches, shard_texts
from model_core.corpus.model import LoadedCorpusModel
from model_core.gate import GATE
from model_core.kernel import apply_mask, attention_scores, weights_from_scores

LONG_FROM = 513
"""From this many tokens a text is scanned alone through the compact pass (``long_text_scan``): a batch's eager
pass holds every layer's (head, pos, pos) weights at once, 18 GB for SmolLM2 at 4,096 tokens."""


@dataclass(frozen=True)
class ShardResult(Scanned):
    """One shard's atlas numbers, texts in text-id order (``Scanned``'s arrays, of this shard's texts), its index
    among the shards and how long it took.

    best_w is NaN where a text has no candidate pair (skipped, or too short); best_q, best_k -1 there; sums and rows
    are summed over the shard's texts (``BatchScan.rows``).
    """

    index: int = 0
    seconds: float = 0.0


def _position_flags(model: LoadedCorpusModel, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Punctuation and special-token flags of a batch's positions, from the vocabulary's flags (``TokenClasses``)."""
    look = ids.cpu().numpy()
    punct = torch.from_numpy(model.classes.punct[look]).to(ids.device)
    special = torch.from_numpy(model.classes.special[look]).to(ids.device)
    return punct, special


def process_shard(model: LoadedCorpusModel, index: int, first_id: int, texts: list[tuple[str, str | None]], *,
                  batch_size: int = 64, max_tokens: int = 512, long: LongPolicy = "truncate",
                  cell_budget: int = DEFAULT_CELL_BUDGET,
                  on_batch: Callable[[int], None] | None = None) -> ShardResult:
    """Every text of one shard (the unit both engines schedule and an atlas folder stores).

    ``on_batch(n)`` is called after each batch with the number of this shard's texts done so far.
    """
    start = time.perf_counter()
    encoded, n_tokens, truncated, skip = shard_texts(model, texts, first_id, max_tokens, long)
    n, shape = len(texts), (len(texts), len(LISTS), model.n_layers, model.n_heads)
    best_w = np.full(shape, np.nan, dtype=np.float32)
    best_q = np.full(shape, -1, dtype=np.int32)
    best_k = np.full(shape, -1, dtype=np.int32)
    sums = np.zeros((model.n_layers, model.n_heads, N_PROFILE))
    rows = np.zeros(3, dtype=np.int64)
    done = int(skip.sum())
    short = [t for t in encoded if len(t.ids) < LONG_FROM]
    batches = plan_batches(short, batch_size, model.n_layers * model.n_heads, cell_budget) + \
        [[t] for t in encoded if len(t.ids) >= LONG_FROM]
    for batch in batches:
        at = [t.text_id - first_id for t in batch]
        with GATE.turn():  # the pass and its scan, as one turn of the route's gate
            scan = _scan_batch(model, batch)
        found = scan.best_w >= 0
        best_w[at] = np.where(found, scan.best_w, np.nan)
        best_q[at] = np.where(found, scan.best_q, -1)
        best_k[at] = np.where(found, scan.best_k, -1)
        sums += scan.sums.sum(0)
        rows += scan.rows.sum(0)
        n_tokens[at] = [len(t.ids) for t in batch]
        truncated[at] = [t.truncated for t in batch]
        if on_batch is not None:
            done += len(batch)
            on_batch(done)
    return ShardResult(np.arange(first_id, first_id + n, dtype=np.int64), n_tokens, truncated, skip, best_w, best_q,
                       best_k, sums, rows, index=index, seconds=time.perf_counter() - start)


def _scan_batch(model: LoadedCorpusModel, batch: list) -> BatchScan:
    """A batch of short texts through the eager pass, or one long text through ``long_text_scan``."""
    ids, types, mask, _ = pad_batch(batch, model.tokenizer.pad_token_id or 0, model.device)
    punct, special = _position_flags(model, ids)
    masks = BatchMasks.build(ids, mask.sum(-1), punct, special, model.family.is_decoder)
    if len(batch) == 1 and len(batch[0].ids) >= LONG_FROM:
        return long_text_scan(model, ids, types, masks)
    weights, _ = model.forward(ids, types, mask)
    return batch_scan(weights, masks)


def weight_blocks(q: torch.Tensor, k: torch.Tensor, mask: Any, scale: float, softcap: float | None,
                  block: int = QUERY_BLOCK) -> Iterator[tuple[slice, torch.Tensor]]:
    """One layer's attention weights of a compact pass, rebuilt in blocks of ``block`` query rows with the model's
    scale, cap and mask (the one score kernel): (rows, weights) a block, weights (head, rows, keys) float32 over the
    keys those rows may see (a causal block's rows see no key after its last row).

    Shape: q (head, pos, d_head); k (head, pos, d_head), each query head's key; mask a ``LayerMask``.
    """
    n = q.shape[1]
    allowed = mask.allowed.to(q.device)
    for r0 in range(0, n, block):
        rows = slice(r0, min(r0 + block, n))
        seen = n if mask.future else rows.stop
        scores = attention_scores(q[:, rows], k[:, :seen], scale=scale, softcap=softcap)
        yield rows, weights_from_scores(apply_mask(scores, allowed[rows, :seen]), dtype=torch.float32)


@torch.inference_mode()
def long_text_scan(model: LoadedCorpusModel, ids: torch.Tensor, types: torch.Tensor, masks: BatchMasks,
                   block: int = QUERY_BLOCK) -> BatchScan:
    """One text's atlas numbers from the compact pass (sdpa: no layer's n x n pattern is formed), each layer's
    weights rebuilt from its queries and keys in blocks of ``block`` query rows with the model's scale, cap and mask
    (the one score kernel), reduced block by block (``layer_scan``): O(head x block x pos) at a time.

    Shape: ids, types (1, pos) on the model's device.
    """
    family, module = model.family, model.module
    out = family.forward(module, ids, types, None, vectors=True, hidden=False, compact=True)
    n = ids.shape[1]
    layer_masks, mask_of_layer = layer_masks_of(out.layer_masks, n, family.is_decoder)
    kv = torch.as_tensor(family.kv_heads(module.config), device=ids.device)
    per_layer = []
    for layer in range(model.n_layers):
        q = out.queries[layer][0]  # (head, pos, d_head)
        k = out.keys[layer][0].index_select(0, kv)  # each query head's key
        out.queries[layer] = out.keys[layer] = None
        blocks = [layer_scan(w[None], masks, rows) for rows, w in weight_blocks(
            q, k, layer_masks[mask_of_layer[layer]], out.layer_scales[layer], out.layer_softcaps[layer], block)]
        per_layer.append(merge_blocks(blocks))
    return batch_scan(per_layer, masks)
