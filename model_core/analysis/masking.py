"""What switching heads off changes, in the spirit of Michel et al. (2019), "Are Sixteen Heads
Really Better than One?" (NeurIPS), which masks heads and measures the effect on the model's output.

Given a baseline trace and a trace of the same input with some heads gated to zero, this compares
the classifier logits (custom encoder), the hidden state of the token the model reads out after every
layer ([CLS] for an encoder, the last token for a decoder), and the attention patterns of every head
(which change only in layers after the first masked one). A decoder's next-token prediction is
compared in ``model_core.analysis.next_token``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.analysis._common import markers, row_blocks
from model_core.trace.trace import AttentionTrace


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
        cls_cosine: cosine similarity of the read-out token's hidden state (``position``: [CLS], or a
            decoder's last token), embeddings first. Shape: (layer + 1,).
        cls_l2: L2 distance of that hidden state. Shape: (layer + 1,).
        attention_tv: total variation ½Σ|p - q| between the heads' attention rows, averaged over
            queries; NaN for heads switched off in either run. Shape: (layer, head).
        attention_js: JS divergence in bits, averaged over queries; NaN where ``attention_tv`` is.
            Shape: (layer, head).
        position: the token whose hidden state ``cls_cosine`` and ``cls_l2`` compare.
        position_label: its name: "[CLS]", or "the last token".
    """

    masked_heads: np.ndarray
    logits_baseline: np.ndarray | None
    logits_masked: np.ndarray | None
    cls_cosine: np.ndarray
    cls_l2: np.ndarray
    attention_tv: np.ndarray
    attention_js: np.ndarray
    position: int = 0
    position_label: str = "[CLS]"

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


_ROWS = 32
"""Query rows per block in ``_pattern_change``: float64 temporaries stay ~ head x 32 x n, in the CPU's cache, and a
causal block computes little right of its last row (0.68 s for SmolLM2 at 512 tokens, 1.12 s with 128 rows)."""


def _rows(x: Any, r0: int, r1: int, width: int) -> Any:
    """Query rows ``r0:r1`` of one layer's weights (numpy or torch, any device), keys up to ``width``, as a float64
    torch block on the CPU: a copy (even of a float64 CPU tensor), so the caller may change it in place."""
    if isinstance(x, np.ndarray):
        return torch.tensor(x[:, r0:r1, :width], dtype=torch.float64)
    return x[:, r0:r1, :width].to("cpu", torch.float64, copy=True)


def _pattern_change(a: Any, b: Any, allowed: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Total variation and JS divergence (bits) between two layers' attention rows, averaged over the query rows
    that attend to something. Computed in blocks of query rows, each only over the keys its rows may see (a causal
    block needs no column right of its last row), in float64 with torch's threads.

    Shape: a, b (head, q_pos, k_pos), numpy or torch; allowed (q_pos, k_pos) bool; queries (q_pos,) bool
    -> (head,), (head,).
    """
    n_heads = a.shape[0]
    tv_sum = torch.zeros(n_heads, dtype=torch.float64)
    js_sum = torch.zeros(n_heads, dtype=torch.float64)
    for r0, r1, width in row_blocks(allowed, _ROWS):
        rows = queries[r0:r1]
        if not rows.any():
            continue
        p, q = _rows(a, r0, r1, width), _rows(b, r0, r1, width)
        if not rows.all():
            keep = torch.from_numpy(rows.copy())
            p, q = p[:, keep], q[:, keep]
        tv_sum += 0.5 * (p - q).abs_().sum(-1).sum(-1)
        # Renormalised as js_divergence does; a row summing to 0 (a switched-off head) gives NaN. In place: the
        # temporaries, not the logarithms, were most of the time.
        p.div_(p.sum(-1, keepdim=True))
        q.div_(q.sum(-1, keepdim=True))
        m = p.add(q).mul_(0.5)
        # sum p log(p/m) + q log(q/m) = sum p log p + q log q - 2 m log m; xlogy(0, .) = 0.
        js = p.xlogy_(p).add_(q.xlogy_(q)).mul_(0.5).sub_(m.xlogy_(m)).sum(-1) / np.log(2.0)
        js_sum += js.clamp_(0.0, 1.0).sum(-1)
    count = max(int(queries.sum()), 1)
    return (tv_sum / count).numpy(), (js_sum / count).numpy()


def attention_change(baseline: np.ndarray, masked: Any, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """How much every head's attention moved between two runs of the same input: total variation and JS divergence
    (bits), averaged over the query rows that attend to something. Switched-off heads are not blanked here.

    A layer whose weights are equal in both runs (every layer up to the first switched-off one) is 0 without
    computing anything.

    Args:
        baseline: the baseline's weights. Shape: (layer, head, q_pos, k_pos).
        masked: the other run's weights, one layer at a time: an array like ``baseline``, or a list of per-layer
            (head, q_pos, k_pos) arrays or torch tensors (``masked_run`` passes its forward pass's own tensors).
        mask: True where a query may attend to a key. Shape: (q_pos, k_pos) bool.

    Shape: -> (layer, head), (layer, head).
    """
    allowed = np.asarray(mask, dtype=bool)
    queries = allowed.any(axis=1)  # rows that attend to something
    n_layers, n_heads = baseline.shape[:2]
    tv = np.zeros((n_layers, n_heads))
    js = np.zeros((n_layers, n_heads))
    for layer in range(n_layers):
        other = masked[layer]
        same = (np.array_equal(baseline[layer], other) if isinstance(other, np.ndarray)
                else np.array_equal(baseline[layer], other.detach().to("cpu").numpy()))
        if not same:  # up to the first switched-off layer nothing changes: skip the logs
            tv[layer], js[layer] = _pattern_change(baseline[layer], other, allowed, queries)
    return tv, js


def compare_masking(baseline: AttentionTrace, masked: Any, position: int | None = None) -> MaskingEffect:
    """Compare a baseline trace with a trace of the same input and some heads switched off.

    Args:
        baseline: all heads on (or the reference head mask).
        masked: the same input with some heads switched off: a trace, or the lean ``masked_run.MaskedRun``.
        position: the token whose hidden states are compared; None for the one the family reads out ([CLS],
            or a decoder's last token, ``_common.markers``).

    Raises:
        ValueError: the two traces are not of the same input and model.
    """
    head_shape = np.shape(masked.head_mask)
    if baseline.tokens != masked.tokens or head_shape != baseline.weights.shape[:2]:
        raise ValueError("Compare two traces of the same model and the same input; only head_mask may differ.")
    if baseline.hidden_states.shape != masked.hidden_states.shape:
        raise ValueError("The two traces have different hidden sizes; use the same model for both.")
    names = markers(baseline)
    label = names.readout_label if position is None else f"token {position}"
    position = names.readout if position is None else int(position)
    if not 0 <= position < baseline.n_tokens:
        raise ValueError(f"position must be between 0 and {baseline.n_tokens - 1}, got {position}.")
    off = ~np.asarray(masked.head_mask, dtype=bool) | ~np.asarray(baseline.head_mask, dtype=bool)
    h1 = np.asarray(baseline.hidden_states[:, position, :], dtype=np.float64)  # (layer + 1, hidden)
    h2 = np.asarray(masked.hidden_states[:, position, :], dtype=np.float64)
    cosine = (h1 * h2).sum(-1) / np.maximum(np.linalg.norm(h1, axis=-1) * np.linalg.norm(h2, axis=-1), 1e-12)
    if getattr(masked, "weights", None) is not None:
        tv, js = attention_change(baseline.weights, masked.weights, baseline.mask)
    else:  # a lean run compared its weights with this baseline's as it ran (masked_run.MaskedRun)
        tv, js = np.array(masked.attention_tv, dtype=np.float64), np.array(masked.attention_js, dtype=np.float64)
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
        position=position,
        position_label=label,
    )
