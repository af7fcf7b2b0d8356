"""What switching heads off changes, in the spirit of Michel et al. (2019), "Are Sixteen Heads
Really Better than One?" (NeurIPS), which masks heads and measures the effect on the model's output.

Given a baseline trace and a trace of the same input with some heads gated to zero, this compares
the classifier logits (custom encoder), the [CLS] hidden state after every layer, and the
attention patterns of every head (which change only in layers after the first masked one).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from model_core.analysis._common import js_divergence
from model_core.trace import AttentionTrace


def head_mask_from_off(n_layers: int, n_heads: int, off: Iterable[tuple[int, int]]) -> np.ndarray:
    """A head mask with every head on except the (layer, head) pairs in ``off``.

    Raises:
        ValueError: a pair is out of range.

    Shape: -> (layer, head) bool.
    """
    mask = np.ones((n_layers, n_heads), dtype=bool)
    for layer, head in off:
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise ValueError(
                f"Head ({layer}, {head}) does not exist: layers are 0-{n_layers - 1}, heads 0-{n_heads - 1}."
            )
        mask[layer, head] = False
    return mask


@dataclass(frozen=True, eq=False)
class MaskingEffect:
    """How a masked run differs from the baseline.

    Attributes:
        masked_heads: True where the masked trace switched the head off. Shape: (layer, head) bool.
        logits_baseline: classifier logits, or None (BERT has no classifier). Shape: (num_labels,).
        logits_masked: Shape: (num_labels,) or None.
        cls_cosine: cosine similarity of the [CLS] hidden state, embeddings first. Shape: (layer + 1,).
        cls_l2: L2 distance of the [CLS] hidden state. Shape: (layer + 1,).
        attention_tv: total variation ½Σ|p - q| between the heads' attention rows, averaged over
            queries; NaN for heads switched off in either run. Shape: (layer, head).
        attention_js: JS divergence in bits, averaged over queries; NaN where ``attention_tv`` is.
            Shape: (layer, head).
    """

    masked_heads: np.ndarray
    logits_baseline: np.ndarray | None
    logits_masked: np.ndarray | None
    cls_cosine: np.ndarray
    cls_l2: np.ndarray
    attention_tv: np.ndarray
    attention_js: np.ndarray

    def __post_init__(self) -> None:
        if self.attention_tv.shape != self.masked_heads.shape or self.attention_js.shape != self.masked_heads.shape:
            raise ValueError("attention_tv and attention_js must be (layer, head) like masked_heads.")
        if self.cls_cosine.shape != (self.masked_heads.shape[0] + 1,) or self.cls_l2.shape != self.cls_cosine.shape:
            raise ValueError("cls_cosine and cls_l2 must be (layer + 1,).")

    @property
    def logits_delta(self) -> np.ndarray | None:
        """Masked minus baseline logits, or None. Shape: (num_labels,)."""
        if self.logits_baseline is None or self.logits_masked is None:
            return None
        return self.logits_masked - self.logits_baseline

    @property
    def prediction_changed(self) -> bool | None:
        """Whether the arg-max label changed, or None without logits."""
        if self.logits_baseline is None or self.logits_masked is None:
            return None
        return bool(np.argmax(self.logits_baseline) != np.argmax(self.logits_masked))

    @property
    def first_masked_layer(self) -> int | None:
        """The lowest layer with a head switched off, or None."""
        layers = np.flatnonzero(self.masked_heads.any(axis=1))
        return int(layers[0]) if layers.size else None


def compare_masking(baseline: AttentionTrace, masked: AttentionTrace) -> MaskingEffect:
    """Compare a baseline trace with a trace of the same input and some heads switched off.

    Raises:
        ValueError: the two traces are not of the same input and model.
    """
    if baseline.tokens != masked.tokens or baseline.attentions.shape != masked.attentions.shape:
        raise ValueError("Compare two traces of the same model and the same input; only head_mask may differ.")
    if baseline.hidden_states.shape != masked.hidden_states.shape:
        raise ValueError("The two traces have different hidden sizes; use the same model for both.")
    off = ~np.asarray(masked.head_mask, dtype=bool) | ~np.asarray(baseline.head_mask, dtype=bool)
    h1 = np.asarray(baseline.hidden_states[:, 0, :], dtype=np.float64)  # (layer + 1, hidden)
    h2 = np.asarray(masked.hidden_states[:, 0, :], dtype=np.float64)
    cosine = (h1 * h2).sum(-1) / np.maximum(np.linalg.norm(h1, axis=-1) * np.linalg.norm(h2, axis=-1), 1e-12)
    queries = np.asarray(baseline.mask).any(axis=1)  # rows that attend to something
    tv = np.empty(off.shape)
    js = np.empty(off.shape)
    for layer in range(off.shape[0]):  # one layer at a time keeps float64 temporaries small at 512 tokens
        if np.array_equal(baseline.attentions[layer], masked.attentions[layer]):
            tv[layer] = js[layer] = 0.0  # up to the first switched-off layer nothing changes: skip the logs
            continue
        a1 = np.asarray(baseline.attentions[layer], dtype=np.float64)  # (head, q_pos, k_pos)
        a2 = np.asarray(masked.attentions[layer], dtype=np.float64)
        tv[layer] = (0.5 * np.abs(a1 - a2).sum(-1))[:, queries].mean(-1)
        js[layer] = js_divergence(a1, a2)[:, queries].mean(-1)
    tv = np.where(off, np.nan, tv)
    js = np.where(off, np.nan, js)
    logits_b = None if baseline.logits is None else np.asarray(baseline.logits, dtype=np.float64)
    logits_m = None if masked.logits is None else np.asarray(masked.logits, dtype=np.float64)
    return MaskingEffect(
        masked_heads=off,
        logits_baseline=logits_b,
        logits_masked=logits_m,
        cls_cosine=cosine,
        cls_l2=np.linalg.norm(h1 - h2, axis=-1),
        attention_tv=tv,
        attention_js=js,
    )
