"""The four steps from scores to weights for one head: scores, mask, masked scores, weights.

The model's own steps come from the trace (its queries, keys, mask and weights). The other variant, the
causal mask on a bidirectional model or no mask on a causal one, is derived from the same head's real scores
(softmax of q·k·scale with the other mask), so a page needs no second forward pass. It is exact for layer 0;
from layer 1 on, the model run with the other mask would also feed different inputs to the layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
    """Row softmax that maps -inf to exactly 0. Shape: (..., k_pos) -> same."""
    top = masked_scores.max(axis=-1, keepdims=True)
    e = np.exp(masked_scores - top)  # exp(-inf) = 0 exactly
    return e / e.sum(axis=-1, keepdims=True)


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
        masked = np.where(trace.mask, scores, np.float32(-np.inf))
        return MaskSteps(scores, trace.mask, masked, trace.weights[layer, head], trace.causal, False,
                         unscaled_std, scaled_std)
    causal = causal_mask_np(trace.n_tokens)
    # The trace's mask is causal & padding: without the causal part, a key stays masked only if padding hid it
    # from every query (a padded key is masked in the whole column).
    mask = causal & trace.mask if apply_causal else np.broadcast_to(trace.mask.any(axis=0), trace.mask.shape)
    masked = np.where(mask, scores, np.float32(-np.inf))
    return MaskSteps(scores, np.array(mask), masked, softmax_rows(masked).astype(np.float32), bool(apply_causal), True,
                     unscaled_std, scaled_std)
