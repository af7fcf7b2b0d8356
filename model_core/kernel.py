"""The one attention score kernel: queries and keys to scores, the mask, each row's log-sum-exp, the weights.

Every place that turns ``q`` and ``k`` into attention weights calls these functions: the hook layer's attention
(``families.hooks``), the full trace's scores, the compact trace's exact windows and pairs, its streamed summary and
views, the mask steps, the contribution graph's rows and the KV lens (``tests/test_kernel.py`` scans for copies).
Names follow TransformerLens: *scores* are ``q·k`` times the model's scale (capped by Gemma 2's softcap), before any
mask; *masked scores* have ``-inf`` where a query may not see a key; *weights* (the pattern) are their
softmax, or ``exp(masked - lse)`` given each row's log-sum-exp ``lse``.

Bottom of ``model_core``: this module imports nothing from it, so every package may use it. The functions take
tensors (or numpy arrays, shared without a copy: nothing here writes to an input unless ``inplace`` says so) and
return tensors. torch's fused CPU attention (``compact.summary``) is the one other route to weights: given an
additive mask from ``additive_mask``, it computes the same softmax inside torch.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
import torch

Array = torch.Tensor | np.ndarray
NEG_INF = float("-inf")


def as_tensor(x: Array) -> torch.Tensor:
    """A tensor of ``x``, sharing a numpy array's memory (read-only arrays too: the kernel never writes to them)."""
    if isinstance(x, torch.Tensor):
        return x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "not writable": nothing here writes to it
        return torch.from_numpy(np.asarray(x))


def on_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``, moved only when it is elsewhere (a host-to-device copy, never a call on the same device)."""
    return t if t.device == torch.device(device) else t.to(device)


def float64_device(device: torch.device | str) -> torch.device:
    """Where a pass's float64 work runs: the model's own device, or the CPU for one without float64 (Apple's MPS)."""
    device = torch.device(device)
    return torch.device("cpu") if device.type == "mps" else device


ROUNDINGS = 8
"""How many of a dtype's epsilons two computations of the same numbers, in another order, may differ by."""


def rounding_tolerance(base: float, dtype: torch.dtype | None) -> float:
    """A relative check's tolerance: ``base``, or ``ROUNDINGS`` epsilons of ``dtype`` where that is larger (bfloat16:
    0.0625, float16: 0.0078; float32 and float64 keep ``base``). A wrong formula is off by far more than either."""
    return base if dtype is None else max(base, ROUNDINGS * torch.finfo(dtype).eps)


# -- scores --------------------------------------------------------------------------------------
def cap_scores(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """Gemma 2's cap on its scores, ``cap·tanh(scores / cap)``, in the eager model's order; None leaves them.

    Shape: (...) -> same.
    """
    if softcap is None:
        return scores
    softcap = float(softcap)  # a numpy scalar on the left of a tensor would make numpy do the product
    return softcap * torch.tanh(scores / softcap)


def attention_scores(q: Array, k: Array, *, scale: float, softcap: float | None = None) -> torch.Tensor:
    """Scores as the model computes them: ``q·kᵀ`` times its scale, capped where it caps (Gemma 2); no mask.

    Without a cap the scale is folded into the queries (one product of (q_pos, d_head), not of the tile); with
    one, the eager model's order: ``cap·tanh((q·kᵀ)·scale / cap)``.

    Args:
        q: the queries, after the rotary embedding. Shape: (..., q_pos, d_head).
        k: the keys, one per query head (``expand_kv``). Shape: (..., k_pos, d_head).
        scale: 1/√d_head for most models (Gemma: query_pre_attn_scalar^-1/2).
        softcap: Gemma 2's attention softcap, or None.

    Shape: -> (..., q_pos, k_pos), in the inputs' dtype; float32 for half-precision inputs (bfloat16, float16):
    scores and weights are always float32's, whatever precision the model runs in.
    """
    q, k, scale = as_tensor(q), as_tensor(k), float(scale)
    if q.dtype in (torch.bfloat16, torch.float16) or k.dtype in (torch.bfloat16, torch.float16):
        q, k = q.float(), k.float()
    if softcap is None:
        return torch.matmul(q * scale, k.transpose(-1, -2))
    return cap_scores(torch.matmul(q, k.transpose(-1, -2)) * scale, softcap)


def pair_scores(q: Array, k: Array, *, scale: float, softcap: float | None = None) -> torch.Tensor:
    """The scores of matched (query, key) pairs, ``q_i·k_i`` in the inputs' dtype, then scaled and capped in
    float64 (a pair's weight is taken against a float64 ``lse``): O(pairs · d_head), no tile.

    Shape: q, k (..., pair, d_head) -> (..., pair) float64.
    """
    q, k = as_tensor(q), as_tensor(k)
    return cap_scores((q * k).sum(-1).double() * float(scale), softcap)


def expand_kv(k: Array, kv_heads: Array) -> torch.Tensor:
    """Each query head's key (or value): its key/value head's, for grouped-query attention.

    Shape: k (kv_head, pos, d_head), kv_heads (head,) int -> (head, pos, d_head).
    """
    return as_tensor(k).index_select(0, as_tensor(kv_heads).long())


# -- masks ---------------------------------------------------------------------------------------
def apply_mask(scores: Array, mask: Array | None, *, inplace: bool = False) -> torch.Tensor:
    """The masked scores: where a query may not see a key, ``-inf`` (a boolean mask) or the additive mask's large
    negative value (as transformers passes it), so that key's weight is 0; None: no mask.

    Args:
        scores: Shape: (..., q_pos, k_pos).
        mask: bool, True where the query may attend to the key; or an additive float mask (0 where it may, -inf or
            ``finfo.min`` where not), added to the scores as eager attention does. Broadcast against ``scores``.
            Shape: (q_pos, k_pos), or any shape that broadcasts.
        inplace: write into ``scores`` (a block of a streamed pass) instead of a new tensor.

    Shape: -> (..., q_pos, k_pos).
    """
    scores = as_tensor(scores)
    if mask is None:
        return scores
    mask = as_tensor(mask)
    if mask.dtype != torch.bool:  # additive
        return scores.add_(mask) if inplace else scores + mask
    return scores.masked_fill_(~mask, NEG_INF) if inplace else scores.masked_fill(~mask, NEG_INF)


def causal_allowed(rows: range, cols: range, device: torch.device | str | None = None) -> torch.Tensor:
    """The causal mask of a window of query rows and key columns: True where key ``j`` is at or before query ``i``.

    Shape: -> (len(rows), len(cols)) bool.
    """
    keys = torch.arange(cols.start, cols.stop, device=device)
    return keys[None, :] <= torch.arange(rows.start, rows.stop, device=device)[:, None]


def allowed_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """A model's attention mask as booleans, True = may attend: a bool mask as it is, an additive float mask True
    where it is not (near) the dtype's lowest value (transformers fills closed cells with ``finfo.min``, not -inf).

    Shape: (...) -> same, bool.
    """
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


def additive_mask(allowed: Array, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask a fused attention kernel wants (it refuses a bool one): 0 where allowed, -inf where not.

    Shape: (q_pos, k_pos) bool -> (q_pos, k_pos) of ``dtype``.
    """
    allowed = as_tensor(allowed)
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, NEG_INF)


# -- weights -------------------------------------------------------------------------------------
def row_lse(masked: Array) -> torch.Tensor:
    """Each row's log-sum-exp over its keys, in float64 (a masked key adds nothing).

    Shape: (..., q_pos, k_pos) -> (..., q_pos) float64.
    """
    return torch.logsumexp(as_tensor(masked).double(), dim=-1)


def weights_from_scores(masked: Array, lse: Array | None = None, *, inplace: bool = False,
                        dtype: torch.dtype | None = None) -> torch.Tensor:
    """The attention weights (pattern) of masked scores: the row softmax, or ``exp(masked - lse)`` given each row's
    log-sum-exp (one pass over a block instead of a softmax's three; exact for any window of the row's keys).

    Args:
        masked: masked scores (``apply_mask``). Shape: (..., q_pos, k_pos).
        lse: each row's log-sum-exp over all its keys (``row_lse``), cast to ``masked``'s dtype; None takes the
            softmax over the keys given. Shape: (..., q_pos).
        inplace: with ``lse``, write the weights into ``masked``.
        dtype: the softmax's dtype where it differs from the scores' (eager attention takes a half-precision
            model's softmax in float32); the weights come back in it.

    Shape: -> (..., q_pos, k_pos) in ``masked``'s dtype (or ``dtype``); 0 where masked.
    """
    masked = as_tensor(masked)
    if lse is None:
        return torch.softmax(masked, dim=-1, dtype=dtype)
    if dtype is not None:
        raise ValueError("dtype is for the softmax; with lse, cast the masked scores to the dtype wanted.")
    lse = as_tensor(lse).to(masked.dtype)[..., None]
    return masked.sub_(lse).exp_() if inplace else torch.exp(masked - lse)


def pair_weights(scores: Array, lse: Array, allowed: Array | None = None) -> torch.Tensor:
    """The weights of matched (query, key) pairs, ``exp(score - lse)`` with each pair's row ``lse``, 0 where not
    ``allowed`` (masked before the exponential: a masked key's score may be huge, and ``inf · 0`` is NaN).

    Shape: scores, lse, allowed (...,) -> (...,) in ``scores``' dtype.
    """
    masked = apply_mask(scores, allowed)
    return torch.exp(masked - as_tensor(lse).to(masked.dtype))


class RowSoftmax(NamedTuple):
    """A block's row softmax with what comes free from it (``softmax_with_lse``).

    Shape: weights (..., q_pos, k_pos) in the scores' dtype; lse (..., q_pos) float64; largest (..., q_pos).
    """

    weights: torch.Tensor
    lse: torch.Tensor
    largest: torch.Tensor


def softmax_with_lse(masked: Array, *, inplace: bool = False) -> RowSoftmax:
    """The row softmax, each row's log-sum-exp and its largest weight in one pass: ``e = exp(s - max)`` has its
    largest entry exactly 1, so the largest weight is ``1 / Σe`` and ``lse = max + log Σe``.

    Args:
        masked: masked scores; every row must allow a key. Shape: (..., q_pos, k_pos).
        inplace: write the weights into ``masked`` (a streamed block's scores, spent after).
    """
    masked = as_tensor(masked)
    top = masked.amax(-1, keepdim=True)  # (..., q_pos, 1)
    e = (masked.sub_(top) if inplace else masked - top).exp_()  # 0 where masked
    total = e.sum(-1, keepdim=True)
    weights = e.div_(total)
    lse = top[..., 0].double() + torch.log(total[..., 0].double())
    return RowSoftmax(weights, lse, 1.0 / total[..., 0])
