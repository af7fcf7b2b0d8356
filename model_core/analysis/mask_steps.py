"""The four steps from scores to weights for one head: scores, mask, masked scores, weights.

The model's own steps come from the trace (its queries, keys, mask and weights). The other variant, the
causal mask on a bidirectional model or no mask on a causal one, is derived from the same head's real scores
(softmax of q·k·scale with the other mask), so a page needs no second forward pass. It is exact for layer 0;
from layer 1 on, the model run with the other mask would also feed different inputs to the layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from model_core.compact.trace import CompactTrace
from model_core.kernel import apply_mask, attention_scores, row_lse, weights_from_scores
from model_core.trace.trace import AttentionTrace


@dataclass(frozen=True)
class MaskSteps:
    """One head's path through the mask.

    Attributes:
        scores: QKᵀ·scale before any mask (scale = 1/√d_head for most models). Shape: (q_pos, k_pos).
        mask: True where attending is allowed. Shape: (q_pos, k_pos) bool.
        masked_scores: scores with -inf where ``mask`` is False. Shape: (q_pos, k_pos).
        weights: softmax of the masked scores. Shape: (q_pos, k_pos).
        causal: whether ``mask`` is the causal (lower-triangular) mask.
        illustrative: True when these steps were derived here with a mask the model did not use (the causal
            mask on BERT, no mask on a decoder), False when these are the model's own numbers.
        unscaled_std: standard deviation of QKᵀ without the 1/√d_head factor.
        scaled_std: standard deviation of QKᵀ/√d_head.
    """

    scores: np.ndarray
    mask: np.ndarray
    masked_scores: np.ndarray
    weights: np.ndarray
    causal: bool
    illustrative: bool
    unscaled_std: float
    scaled_std: float


def softmax_rows(masked_scores: np.ndarray) -> np.ndarray:
    """Row softmax that maps -inf to exactly 0 (the score kernel's). Shape: (..., k_pos) -> same."""
    return weights_from_scores(masked_scores).numpy()


def causal_mask_np(n: int) -> np.ndarray:
    """np.tril of ones as booleans: True where key j <= query i. Shape: (n, n)."""
    return np.tril(np.ones((n, n), dtype=bool))


def mask_steps(trace: AttentionTrace, layer: int, head: int, *, apply_causal: bool | None = None) -> MaskSteps:
    """The mask steps of one head.

    Args:
        apply_causal: None keeps the model's own mask and weights (the trace's numbers). True on a
            bidirectional trace applies the lower-triangular mask (``np.tril``, as ``torch.tril`` in the
            encoder) to the head's real scores; False on a causal trace drops the causal mask (keeping any
            padding) and takes the softmax of the unmasked scores. Both are marked ``illustrative``.

    Raises:
        ValueError: the layer/head is out of range.
    """
    scores = trace.head_scores(layer, head)
    scaled_std = float(scores.std())
    q = trace.queries[layer, head].astype(np.float64)  # (pos, d_head)
    k = trace.keys[layer, head].astype(np.float64)
    unscaled_std = float((q @ k.T).std())  # QKᵀ itself, before the 1/√d_head
    if apply_causal is None or apply_causal == trace.causal:
        masked = apply_mask(scores, trace.mask).numpy()
        return MaskSteps(scores, trace.mask, masked, trace.weights[layer, head], trace.causal, False,
                         unscaled_std, scaled_std)
    causal = causal_mask_np(trace.n_tokens)
    # The trace's mask is causal & padding: without the causal part, a key stays masked only if padding hid it
    # from every query (a padded key is masked in the whole column).
    mask = causal & trace.mask if apply_causal else np.broadcast_to(trace.mask.any(axis=0), trace.mask.shape)
    masked = apply_mask(scores, mask).numpy()
    return MaskSteps(scores, np.array(mask), masked, softmax_rows(masked).astype(np.float32), bool(apply_causal), True,
                     unscaled_std, scaled_std)


def window_steps(trace: CompactTrace, layer: int, head: int, start: int, size: int,
                 apply_causal: bool | None = None) -> MaskSteps:
    """The causal page's four steps (``MaskSteps``) for a square window of one head of a compact trace on the
    diagonal, positions ``start`` to ``start + size``, exact.

    ``apply_causal=None`` gives the model's own numbers: its weights over the whole input, shown in the window (a
    row sums to 1 only with the keys before the window). ``False`` on a causal trace drops the causal mask: the
    softmax over every key of the input, its log-sum-exp computed for the window's rows from the queries and keys.

    Raises:
        ValueError: the layer, head or window is out of range.
    """
    trace._check(layer, head)
    n = trace.n_tokens
    if not (0 <= start and 1 <= size and start + size <= n):
        raise ValueError(f"The window {start}:{start + size} is out of range: pick one inside 0:{n}.")
    rows = slice(start, start + size)
    q = torch.from_numpy(trace.queries[layer, head, rows])
    k_all = torch.from_numpy(trace.keys[layer, int(trace.kv_heads[head])])
    scores = attention_scores(q, k_all[rows], scale=trace.score_scale, softcap=trace.score_softcap)  # (size, size)
    mask = trace.masks[trace.mask_of_layer[layer], rows, rows]
    unscaled = torch.matmul(q.double(), k_all[rows].double().T)
    own = apply_causal is None or apply_causal == trace.causal
    if own:
        masked = apply_mask(scores, mask)
        weights = trace.weights(layer, head, rows, rows)
    else:
        if apply_causal:
            raise ValueError("A compact trace is a decoder's: it has its causal mask already.")
        mask = np.ones_like(mask)
        masked = scores
        lse_all = row_lse(attention_scores(q, k_all, scale=trace.score_scale, softcap=trace.score_softcap))
        weights = weights_from_scores(scores.double(), lse_all).float().numpy()
    s = scores.numpy()
    return MaskSteps(s, mask, masked.numpy(), weights, bool(trace.causal if own else apply_causal), not own,
                     float(unscaled.std()), float(s.std()))
