"""One padded batch's atlas numbers, on the model's device: each text's best (query, key) per head, and the sums
behind each head's profile (where its weight goes, on average).

The profile of a head is a mean over every real query row of the corpus (each row counts once): the share of the
row's weight at relative offsets 0, −1, −2, −3 and further; at the first token; at punctuation; and its entropy in
bits. Two shares are means over the rows where they can be non-zero: at another copy of the query's token
("same token": earlier or, in an encoder, later; the query itself and special tokens left out), and at the token after
an earlier copy of the query's token ("induction", Olsson et al.; every earlier copy, the query itself left out).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from model_core.atlas.keys import DECODER_MIN_QUERY


@dataclass(frozen=True)
class BatchMasks:
    """What the scan needs of a padded batch, on the model's device.

    Shape: valid (batch, pos) bool; cand, same, induction (batch, q_pos, k_pos) bool; punct (batch, pos) float32.
    """

    valid: torch.Tensor
    cand: torch.Tensor
    same: torch.Tensor
    induction: torch.Tensor
    punct: torch.Tensor

    @classmethod
    def build(cls, ids: torch.Tensor, lengths: torch.Tensor, punct: torch.Tensor, special: torch.Tensor,
              is_decoder: bool) -> BatchMasks:
        """Masks of a right-padded batch: ``ids`` (batch, pos), ``lengths`` (batch,), per-position flags ``punct``
        and ``special`` (batch, pos) bool."""
        n = ids.shape[1]
        pos = torch.arange(n, device=ids.device)
        valid = pos[None, :] < lengths[:, None]  # (B, n)
        pair = valid[:, :, None] & valid[:, None, :]  # (B, q, k)
        q_pos, k_pos = pos[:, None], pos[None, :]
        visible = pair & (k_pos <= q_pos) if is_decoder else pair
        min_q = DECODER_MIN_QUERY if is_decoder else 0
        cand = visible & (q_pos >= min_q)
        word = valid & ~special
        same = visible & (ids[:, :, None] == ids[:, None, :]) & word[:, :, None] & word[:, None, :] & (q_pos != k_pos)
        # key k follows an earlier copy of the query's token: ids[k - 1] == ids[q], k - 1 < q, k != q
        before = torch.cat([torch.full_like(ids[:, :1], -1), ids[:, :-1]], dim=1)  # (B, n): ids[k - 1]
        before_word = torch.cat([torch.zeros_like(word[:, :1]), word[:, :-1]], dim=1)
        induction = (pair & (before[:, None, :] == ids[:, :, None]) & word[:, :, None] & before_word[:, None, :]
                     & (k_pos < q_pos) & (k_pos >= 1))
        return cls(valid, cand, same, induction, (punct & valid).to(torch.float32))


@dataclass(frozen=True)
class BatchScan:
    """A batch's atlas numbers, on the host.

    Shape: best_w (text, list, layer, head) float32, -1 where a text has no candidate pair; best_q, best_k the same
    shape, int32; sums (text, layer, head, profile) float64 (``PROFILE_KEYS``); rows (text, 3) int64: the real query
    rows, those with another copy of their token, those with an induction target.
    """

    best_w: np.ndarray
    best_q: np.ndarray
    best_k: np.ndarray
    sums: np.ndarray
    rows: np.ndarray


def _best_pairs(w: torch.Tensor, cand: torch.Tensor, row0: int = 0) -> list[tuple[torch.Tensor, ...]]:
    """Each text's and head's highest weight among the ``cand`` (batch, q, k) pairs, then among those whose key is not
    the first token, with its (query, key); ties to the earlier query, then the earlier key (argmax returns the first
    maximum of the row-major flattening). The rows are queries ``row0`` on. One masked copy of ``w`` serves both."""
    n = w.shape[-1]
    masked = w.masked_fill(~cand[:, None], -1.0)  # (B, H, q, k)
    out = []
    for keep_first in (True, False):
        if not keep_first:
            masked[..., 0] = -1.0
        value, index = masked.flatten(2).max(dim=-1)
        out.append((value, torch.div(index, n, rounding_mode="floor") + row0, index % n))
    return out


def _masked_sum(w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ over (q, k) of w where ``mask`` (batch, q, k) holds, per text and head, from the mask's true cells alone (the
    same-token and induction cells are a small share of a long text's). Shape: w (batch, head, q, k) -> (batch, head).
    """
    b, q, k = mask.nonzero(as_tuple=True)
    at = w[b, :, q, k]  # (cells, head)
    return torch.zeros(w.shape[0], w.shape[1], dtype=w.dtype, device=w.device).index_add_(0, b, at)


def layer_scan(w: torch.Tensor, m: BatchMasks, rows: slice = slice(None)) -> tuple[torch.Tensor, ...]:
    """One layer's numbers, of every query row or of the block of query rows ``rows`` (then the sums are the block's
    share, and the best pairs the block's best). A block's weights may stop at a key before the last (the keys past
    it have weight 0: a causal block's rows see nothing after its last row). Shape: w (batch, head, q, k) -> best_w,
    best_q, best_k (batch, list, head); sums (batch, head, profile)."""
    w = w.to(torch.float32)
    row0 = rows.start or 0
    n_rows, n_keys = w.shape[-2:]  # a block of a causal layer may stop at its last row's key
    valid_q = m.valid[:, row0:row0 + n_rows]
    v = valid_q[:, None, :].to(torch.float32)  # (B, 1, q)
    row_total = (w.sum(-1) * v).sum(-1)
    sums = []
    q_pos = torch.arange(row0, row0 + n_rows, device=w.device)
    for d in range(4):  # w[i, i - d] for i >= d
        k_pos = q_pos - d
        at = w.gather(-1, k_pos.clamp(min=0)[None, None, :, None].expand(*w.shape[:-1], 1)).squeeze(-1)
        sums.append((at * v * (k_pos >= 0)).sum(-1))
    sums.append(row_total - sum(sums))
    sums.append((w[..., 0] * v).sum(-1))
    at_punct = (w @ m.punct[:, None, :n_keys, None]).squeeze(-1)  # (B, H, q): each row's weight at punctuation
    sums.append((at_punct * v).sum(-1))
    plogp = w * torch.log2(torch.where(w > 0, w, torch.ones_like(w)))  # 0 log 0 = 0
    sums.append(-(plogp.sum(-1) * v).sum(-1))
    cand, same, induction = (x[:, row0:row0 + n_rows, :n_keys] for x in (m.cand, m.same, m.induction))
    sums.append(_masked_sum(w, same))
    sums.append(_masked_sum(w, induction))
    best = _best_pairs(w, cand, row0)
    return (torch.stack([b[0] for b in best], 1), torch.stack([b[1] for b in best], 1),
            torch.stack([b[2] for b in best], 1), torch.stack(sums, -1))


def merge_blocks(per_block: list[tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
    """``layer_scan``'s numbers of a layer's query blocks, in row order, as one: the sums added, each best pair the
    highest weight, an earlier block's kept on a tie (the earlier query)."""
    best_w, best_q, best_k, sums = per_block[0]
    for w, q, k, s in per_block[1:]:
        better = w > best_w
        best_w, best_q, best_k = torch.where(better, w, best_w), torch.where(better, q, best_q), \
            torch.where(better, k, best_k)
        sums = sums + s
    return best_w, best_q, best_k, sums


def batch_scan(weights: list[torch.Tensor] | list[tuple[torch.Tensor, ...]], m: BatchMasks) -> BatchScan:
    """Every layer of a padded batch, copied to the host once.

    Shape: weights: layer tensors of (batch, head, q, k), or each layer's ``layer_scan`` numbers already taken.
    """
    per_layer = [w if isinstance(w, tuple) else layer_scan(w, m) for w in weights]
    best_w, best_q, best_k = (torch.stack([p[i] for p in per_layer], 2) for i in range(3))  # (B, list, L, H)
    sums = torch.stack([p[3] for p in per_layer], 1)  # (B, L, H, profile)
    rows = torch.stack([m.valid.sum(-1), m.same.any(-1).sum(-1), m.induction.any(-1).sum(-1)], -1)
    return BatchScan(best_w.to("cpu", torch.float32).numpy(), best_q.to("cpu", torch.int32).numpy(),
                     best_k.to("cpu", torch.int32).numpy(), sums.to("cpu", torch.float64).numpy(),
                     rows.to("cpu", torch.int64).numpy())
