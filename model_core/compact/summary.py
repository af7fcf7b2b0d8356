"""One layer of a compact trace summarised: each row's log-sum-exp, the overview's exact block means and the
head statistics, without ever holding the layer's n x n weights.

Two routes give the same numbers. Where the model's scores are plain ``q·k`` times a scale and no query sees a
later key (every decoder but Gemma 2), one call of torch's fused CPU attention kernel, the one sdpa runs, does it:
given values chosen for the purpose instead of the model's, it returns ``Σ_j w_ij v_j`` and the rows' ``lse``
while keeping only a tile of scores in cache. Elsewhere (encoders, softcapped scores) blocks of query rows are
scored, softmaxed and reduced in torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from model_core.compact.trace import QUERY_BLOCK, STAT_NAMES, LayerMask
from model_core.kernel import (additive_mask, apply_mask, attention_scores, expand_kv, pair_scores, pair_weights,
                               softmax_with_lse)

_FUSED = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
"""torch's fused CPU attention: (output, logsumexp) for given queries, keys and values."""
DEVICE_BLOCK_NUMBERS = 1 << 26
"""The most scores a streamed block holds on an accelerator (256 MB of float32; a block's pass makes about three
such buffers): 1,792 rows of SmolLM2's 9 heads at 4,096 tokens, against ``QUERY_BLOCK``'s 256 on the CPU."""
HOT = 2.0 ** 20
"""The inverse temperature that turns a row's log-sum-exp into its largest score: ``lse(HOT·s) / HOT`` lies
between ``max(s)`` and ``max(s) + log(n) / HOT`` (8e-6 at 4,096 keys), so the largest weight is within 1e-5."""


@dataclass
class LayerSummary:
    """One layer's row log-sum-exps, overview block sums and statistic sums, from ``summarise_layer``."""

    lse: torch.Tensor  # (head, pos) float64
    overview: torch.Tensor  # (head, m, m)
    stats: dict[str, torch.Tensor]  # name -> (head,)


def block_rows(n_heads: int, n: int, device: torch.device) -> int:
    """Query rows a streamed block scores at once: ``QUERY_BLOCK`` on the CPU (a block's scores stay in its
    caches); on an accelerator as many multiples of it as keep a block's scores within ``DEVICE_BLOCK_NUMBERS``, so
    a layer is a few large kernels and not n / 256 small ones."""
    if device.type == "cpu":
        return QUERY_BLOCK
    return max(1, DEVICE_BLOCK_NUMBERS // (n_heads * max(n, 1) * QUERY_BLOCK)) * QUERY_BLOCK


def _summarise_blocks(q: torch.Tensor, k: torch.Tensor, mask: LayerMask, scale: float,
                      softcap: float | None, pool: int, block: int | None = None) -> LayerSummary:
    """Log-sum-exps, exact overview block means and head statistics of one layer, streamed over query blocks.

    A block of rows reads only the keys up to the last one any of its rows may see, so a causal layer costs
    about half the square. The weights are the model's own float32 softmax; ``lse`` comes from it as
    ``max(score) - log(max(weight))``, and the entropy as ``lse - Σ w·score`` (no logarithm of every weight).

    On an accelerator everything stays there (the mask moved there too: ``LayerMask.to``), in blocks of
    ``block_rows`` rows, with no copy to the host: the caller copies the summary once.

    Shape: q (head, pos, d_head) float32; k (head, pos, d_head), each query head's key.
    """
    allowed, future, causal = mask.allowed, mask.future, mask.causal
    n_heads, n, _ = q.shape
    at = q.device
    block = block_rows(n_heads, n, at) if block is None else block
    m = math.ceil(n / pool)
    f64 = dict(dtype=torch.float64, device=at)
    lse = torch.empty(n_heads, n, **f64)
    cell_sums = torch.zeros(n_heads, m, m, **f64)
    sums = {name: torch.zeros(n_heads, **f64) for name in STAT_NAMES if name != "max_weight"}
    max_weight = torch.zeros(n_heads, **f64)
    choosing = mask.choosing
    # Whether any query may see a later key (an encoder; a decoder's layer never): the mean distance then needs
    # the part past the diagonal too.
    for r0 in range(0, n, block):
        r1 = min(r0 + block, n)
        if causal:  # a causal block sees keys 0..r1-1 and is masked only in its square on the diagonal
            width = r1
        else:
            seen = torch.nonzero(allowed[r0:r1].any(0))
            width = int(seen[-1]) + 1 if len(seen) else 1
        rows, cols = torch.arange(r0, r1, device=at), torch.arange(width, device=at)
        q_blk, k_blk = q[:, r0:r1], k[:, :width]
        s = attention_scores(q_blk, k_blk, scale=scale, softcap=softcap)  # (head, rows, width), finite
        if causal:
            apply_mask(s[:, :, r0:r1], allowed[r0:r1, r0:r1], inplace=True)
        else:
            apply_mask(s, allowed[r0:r1, :width], inplace=True)
        # The softmax in place, with each row's lse and largest weight and no second pass for either; s is spent.
        w, row_lse, w_max = softmax_with_lse(s, inplace=True)  # (head, rows, width), (head, rows) x 2
        lse[:, r0:r1] = row_lse
        mixed_k = torch.matmul(w, k_blk)  # Σ_j w_ij k_j: (head, rows, d_head)
        if softcap is None:  # Σ_j w_ij s_ij = scale · q_i · Σ_j w_ij k_j: no elementwise pass over the block
            w_s = scale * (q_blk * mixed_k).sum(-1)
        else:  # capped scores are not linear in k: recompute them (a softcap model's layers cost one pass more)
            capped = attention_scores(q_blk, k_blk, scale=scale, softcap=softcap)
            w_s = (w * capped).sum(-1)  # finite everywhere; w is 0 where masked
        sums["entropy"] += (row_lse - w_s.double()).sum(-1) / math.log(2.0)
        sums["to_first"] += w[..., 0].sum(-1).double()
        sums["to_self"] += w[:, rows - r0, rows].sum(-1).double()
        prev = rows[rows >= 1]
        sums["to_prev"] += w[:, prev - r0, prev - 1].sum(-1).double()
        nxt = rows[rows + 1 < width]
        sums["to_next"] += w[:, nxt - r0, nxt + 1].sum(-1).double()
        # Σ_j w_ij |i - j| = Σ_j w_ij (i - j) + 2 Σ_{j > i} w_ij (j - i); the first part is a product with j.
        distance = rows.double() - torch.matmul(w, cols.float()).double()  # every row sums to 1
        if future:
            ahead = (cols[None, :] - rows[:, None]).clamp(min=0).float()
            distance += 2 * (w * ahead).sum(-1).double()
        sums["mean_distance"] += distance.sum(-1)
        # The rows that choose (a causal model's first has one key); weights are >= 0, so the others count 0.
        max_weight = torch.maximum(max_weight, w_max.masked_fill(~choosing[r0:r1], 0.0).amax(-1).double())
        whole = width // pool  # key cells wholly inside the block's width; the last may be cut short
        by_key = w[..., :whole * pool].reshape(n_heads, r1 - r0, whole, pool).sum(-1)  # (head, rows, key cell)
        if whole * pool < width:
            by_key = torch.cat([by_key, w[..., whole * pool:].sum(-1, keepdim=True)], dim=-1)
        cell_sums[:, :, :by_key.shape[-1]].index_add_(1, rows // pool, by_key.double())
    row_count = torch.bincount(torch.arange(n, device=at) // pool, minlength=m).double()
    stats = {name: total / n for name, total in sums.items()}
    stats["to_prev"] = sums["to_prev"] / max(n - 1, 1)
    stats["to_next"] = sums["to_next"] / max(n - 1, 1)
    stats["max_weight"] = max_weight
    return LayerSummary(lse=lse, overview=cell_sums / row_count[None, :, None], stats=stats)




def _fusable(q: torch.Tensor, mask: LayerMask, softcap: float | None) -> bool:
    """Whether torch's fused kernel computes this layer's weights: plain scores, no key past the query, CPU."""
    return _FUSED is not None and softcap is None and q.device.type == "cpu" and not mask.future


def summarise_layer(q: torch.Tensor, k: torch.Tensor, mask: LayerMask | torch.Tensor, scale: float,
                    softcap: float | None, pool: int, largest: bool = True) -> LayerSummary:
    """Log-sum-exps, exact overview block means and head statistics of one layer, with O(pos) memory.

    ``mask`` is a ``LayerMask`` (made once per distinct mask) or the boolean mask itself. ``largest`` asks for the
    ``max_weight`` statistic too: on the fused route a second pass over the layer (about a third of the summary's
    time), so the app leaves it for the page that shows it (``largest_weights``).

    Shape: q (head, pos, d_head) float32; k (head, pos, d_head), each query head's key; a mask (pos, pos) bool.
    """
    mask = mask if isinstance(mask, LayerMask) else LayerMask.of(mask)
    if _fusable(q, mask, softcap):
        summary = _summarise_fused(q, k, mask, scale, pool, largest)
    else:
        summary = _summarise_blocks(q, k, mask, scale, softcap, pool)
    # STAT_NAMES' order on either route (a trace's stat_names list them so)
    summary.stats = {name: summary.stats[name] for name in STAT_NAMES if name in summary.stats
                     and (largest or name != "max_weight")}
    return summary


def _row_max_scores(q: torch.Tensor, k: torch.Tensor, mask: LayerMask, scale: float,
                    softcap: float | None) -> torch.Tensor:
    """Each row's largest allowed score. Shape: q, k (head, pos, d_head) -> (head, pos) float64."""
    if _fusable(q, mask, softcap):
        _, hot = _FUSED(q[None], k[None], k[None], 0.0, mask.causal, attn_mask=_additive(mask, q.dtype),
                        scale=scale * HOT)
        return hot[0].double() / HOT
    out = torch.empty(q.shape[:2], dtype=torch.float64)
    for r0 in range(0, q.shape[1], QUERY_BLOCK):
        r1 = min(r0 + QUERY_BLOCK, q.shape[1])
        s = apply_mask(attention_scores(q[:, r0:r1], k, scale=scale, softcap=softcap), mask.allowed[r0:r1],
                       inplace=True)
        out[:, r0:r1] = s.amax(-1).double()
    return out


def _largest(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, mask: LayerMask, scale: float,
             softcap: float | None) -> torch.Tensor:
    """Each head's largest weight over the queries that may see more than one key (as ``head_stats``).

    Shape: q, k (head, pos, d_head); lse (head, pos) float64 -> (head,) float64."""
    w_max = pair_weights(_row_max_scores(q, k, mask, scale, softcap), lse)  # each row's weight on its top key
    return w_max[:, mask.choosing].amax(-1).clamp(max=1.0)


def largest_weights(trace, progress: Callable[[float], None] | None = None) -> np.ndarray:
    """The ``max_weight`` statistic of a compact trace built without it, from its queries, keys and lse: one
    pass over each layer. Shape: -> (layer, head) float64."""
    out = np.empty((trace.n_layers, trace.n_heads))
    kv = torch.from_numpy(trace.kv_heads)
    for layer in range(trace.n_layers):
        q = torch.from_numpy(trace.queries[layer])
        k = expand_kv(trace.keys[layer], kv)
        out[layer] = _largest(q, k, torch.from_numpy(trace.lse[layer]), trace.layer_mask(layer),
                              trace.score_scale, trace.score_softcap).numpy()
        if progress is not None:
            progress((layer + 1) / trace.n_layers)
    return out


def group_shares(q: torch.Tensor, k: torch.Tensor, mask: LayerMask, scale: float, softcap: float | None,
                 group_of: torch.Tensor, n_groups: int) -> torch.Tensor | None:
    """One head's weight from every row on each group of keys, by the fused kernel with one-hot values (the last
    group is the rest of 1); None where the kernel does not apply (the caller then scores blocks of rows).

    Shape: q, k (pos, d_head); group_of (pos,) int64 -> (pos, n_groups) float64.
    """
    if not _fusable(q, mask, softcap):
        return None
    n, d = q.shape
    width = max(d, n_groups - 1)
    values = torch.zeros(n, width, dtype=q.dtype)
    inner = group_of < n_groups - 1
    values[torch.arange(n)[inner], group_of[inner]] = 1.0
    qp, kp = F.pad(q, (0, width - d)), F.pad(k, (0, width - d))
    out, _ = _FUSED(qp[None, None], kp[None, None], values[None, None], 0.0, mask.causal,
                    attn_mask=_additive(mask, q.dtype), scale=scale)
    shares = out[0, 0, :, :n_groups - 1].double()
    return torch.cat([shares, 1.0 - shares.sum(-1, keepdim=True)], dim=-1)


def _additive(mask: LayerMask, dtype: torch.dtype) -> torch.Tensor | None:
    """The fused kernel's ``attn_mask``: None for the plain causal mask (its ``is_causal`` flag does it), else an
    additive mask of the queries' dtype (the kernel refuses a bool one): sliding-window layers and the like."""
    if mask.causal:
        return None
    return additive_mask(mask.allowed, dtype)


def _entries(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, allowed: torch.Tensor, scale: float,
             offset: int) -> torch.Tensor:
    """The weights ``w[i, i + offset]`` of every row that has that key, from ``exp(score - lse)``: O(pos · d_head).

    Shape: q, k (head, pos, d_head); lse (head, pos) float64 -> (head, rows) float64.
    """
    n = q.shape[1]
    rows = torch.arange(max(0, -offset), min(n, n - offset))
    cols = rows + offset
    scores = pair_scores(q[:, rows], k[:, cols], scale=scale)  # (head, rows) float64
    return pair_weights(scores, lse[:, rows], allowed[rows, cols])


def _summarise_fused(q: torch.Tensor, k: torch.Tensor, mask: LayerMask, scale: float,
                     pool: int, largest: bool = True) -> LayerSummary:
    """``summarise_layer`` by torch's fused attention kernel, for scores ``scale·q·k`` with no key past the query.

    One call, whose values are each key's vector, its position and a one-hot of its overview cell, returns per
    row the log-sum-exp, ``Σ_j w_ij k_j`` (the entropy is ``lse - scale·q_i·Σ_j w_ij k_j``), ``Σ_j w_ij j`` (the
    mean distance) and the row's weight in each key cell (the overview; the last cell is the rest of 1). Single
    weights (first, self, previous, next) are ``exp(score - lse)`` at O(pos). A second call at inverse temperature
    ``HOT`` gives each row's largest score, and so its largest weight.
    """
    n_heads, n, d = q.shape
    m = math.ceil(n / pool)
    cols = torch.arange(n)
    cell = cols // pool
    width = d + 1 + (m - 1)  # keys, position, every overview cell but the last
    values = torch.zeros(n_heads, n, width, dtype=q.dtype)
    values[..., :d] = k
    values[..., d] = cols.to(q.dtype) / n  # positions scaled to [0, 1) to keep float32's digits
    inner = cell < m - 1
    values[:, cols[inner], d + 1 + cell[inner]] = 1.0
    # The kernel wants one head size for queries, keys and values: zeros appended to q and k leave q·k as it is.
    qp, kp = F.pad(q, (0, width - d)), F.pad(k, (0, width - d))
    allowed = mask.allowed
    out, lse32 = _FUSED(qp[None], kp[None], values[None], 0.0, mask.causal, attn_mask=_additive(mask, q.dtype),
                        scale=scale)
    out, lse = out[0], lse32[0].double()  # (head, pos, width), (head, pos)
    by_cell = out[..., d + 1:].double()  # (head, pos, m - 1)
    by_cell = torch.cat([by_cell, 1.0 - by_cell.sum(-1, keepdim=True)], dim=-1)  # (head, pos, m)
    cell_sums = torch.zeros(n_heads, m, m, dtype=torch.float64).index_add_(1, cell, by_cell)
    rows = cols.double()
    sums = {
        "entropy": (lse - scale * (q * out[..., :d]).sum(-1).double()).sum(-1) / math.log(2.0),
        "mean_distance": (rows - out[..., d].double() * n).sum(-1),  # Σ_j w_ij (i - j), as no j > i is seen
        "to_first": _first_key(q, k, lse, allowed, scale).sum(-1),
    }
    sums["to_self"] = _entries(q, k, lse, allowed, scale, 0).sum(-1)
    sums["to_prev"] = _entries(q, k, lse, allowed, scale, -1).sum(-1)
    sums["to_next"] = _entries(q, k, lse, allowed, scale, 1).sum(-1)
    row_count = torch.bincount(cell, minlength=m).double()
    stats = {name: total / n for name, total in sums.items()}
    stats["to_prev"] = sums["to_prev"] / max(n - 1, 1)
    stats["to_next"] = sums["to_next"] / max(n - 1, 1)
    if largest:
        stats["max_weight"] = _largest(q, k, lse, mask, scale, None)
    return LayerSummary(lse=lse, overview=cell_sums / row_count[None, :, None], stats=stats)


def _first_key(q: torch.Tensor, k: torch.Tensor, lse: torch.Tensor, allowed: torch.Tensor,
               scale: float) -> torch.Tensor:
    """Every row's weight on the first key. Shape: (head, pos, d_head) x 2, lse (head, pos) -> (head, pos) float64."""
    return pair_weights(pair_scores(q, k[:, :1], scale=scale), lse, allowed[:, 0])
