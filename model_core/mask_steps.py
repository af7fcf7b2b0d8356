"""The four steps from scores to weights for one head: scores, mask, masked scores, weights."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model_core.trace import AttentionTrace


@dataclass(frozen=True)
class MaskSteps:
    """One head's path through the mask.

    Attributes:
        scores: QKᵀ/√d_head before any mask. Shape: (q_pos, k_pos).
        mask: True where attending is allowed. Shape: (q_pos, k_pos) bool.
        masked_scores: scores with -inf where ``mask`` is False. Shape: (q_pos, k_pos).
        weights: softmax of the masked scores. Shape: (q_pos, k_pos).
        causal: whether ``mask`` is the causal (lower-triangular) mask.
        illustrative: True when the mask was applied here to a model that did not use it
            (BERT is bidirectional), False when these are the model's own numbers.
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
        apply_causal: None keeps the model's own mask and weights (the trace's numbers); True
            applies the encoder's lower-triangular mask (``np.tril``, as ``torch.tril`` there) to
            the head's real scores as an illustration when the model did not use it; False on a
            causal trace is refused (its weights were causal).

    Raises:
        ValueError: the layer/head is out of range, or bidirectional steps are asked of a causal trace.
    """
    scores = trace.head_scores(layer, head)
    scaled_std = float(scores.std())
    q = trace.queries[layer, head].astype(np.float64)  # (pos, d_head)
    k = trace.keys[layer, head].astype(np.float64)
    unscaled_std = float((q @ k.T).std())  # QKᵀ itself, before the 1/√d_head
    if apply_causal is None or apply_causal == trace.causal:
        masked = np.where(trace.mask, scores, np.float32(-np.inf))
        return MaskSteps(scores, trace.mask, masked, trace.attentions[layer, head], trace.causal, False,
                         unscaled_std, scaled_std)
    if not apply_causal:
        raise ValueError("This trace comes from a causal model; run the model bidirectionally for unmasked weights.")
    mask = causal_mask_np(trace.n_tokens) & trace.mask
    masked = np.where(mask, scores, np.float32(-np.inf))
    return MaskSteps(scores, mask, masked, softmax_rows(masked).astype(np.float32), True, True,
                     unscaled_std, scaled_std)
