"""Norm-weighted attention, after Kobayashi et al. (2020), "Attention is Not Only a Weight:
Analyzing Transformers with Vector Norms" (EMNLP).

A head's output for query i is Σ_j α_ij · f(x_j) with f(x_j) = v_j W_Oʰ (the value after the head's
slice of the output projection). The size of what token j contributes is ‖α_ij f(x_j)‖ =
α_ij · ‖f(x_j)‖, which can be small even when α_ij is large: a head that puts most of its weight on
[SEP] but whose [SEP] value vector is tiny contributes almost nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model_core.analysis._common import token_flags
from model_core.trace import AttentionTrace


def norm_weighted_attention(attentions: np.ndarray, value_norms: np.ndarray) -> np.ndarray:
    """‖α_ij f(x_j)‖ = α_ij · ‖v_j W_Oʰ‖ for every layer, head, query and key.

    Shape: attentions (layer, head, q_pos, k_pos), value_norms (layer, head, k_pos)
        -> (layer, head, q_pos, k_pos).
    """
    attentions = np.asarray(attentions, dtype=np.float64)
    value_norms = np.asarray(value_norms, dtype=np.float64)
    if value_norms.shape != attentions.shape[:2] + attentions.shape[-1:]:
        raise ValueError(
            f"value_norms must be (layer, head, k_pos) = {attentions.shape[:2] + attentions.shape[-1:]}, "
            f"got {value_norms.shape}."
        )
    return attentions * value_norms[:, :, None, :]


@dataclass(frozen=True, eq=False)
class SpecialTokenMass:
    """Share of attention that goes to [CLS] and [SEP], raw and norm-weighted.

    Each share is the mass on those keys divided by the total mass, summed over all queries.

    Attributes:
        raw_cls: Shape: (layer, head).
        raw_sep: Shape: (layer, head).
        norm_cls: Shape: (layer, head).
        norm_sep: Shape: (layer, head).
    """

    raw_cls: np.ndarray
    raw_sep: np.ndarray
    norm_cls: np.ndarray
    norm_sep: np.ndarray

    def __post_init__(self) -> None:
        shapes = {a.shape for a in (self.raw_cls, self.raw_sep, self.norm_cls, self.norm_sep)}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2:
            raise ValueError("Every share must be a (layer, head) array of the same shape.")

    def per_layer(self) -> dict[str, np.ndarray]:
        """Mean over heads of each share. Shape: each (layer,)."""
        return {
            "raw [CLS]": self.raw_cls.mean(axis=1),
            "raw [SEP]": self.raw_sep.mean(axis=1),
            "norm-weighted [CLS]": self.norm_cls.mean(axis=1),
            "norm-weighted [SEP]": self.norm_sep.mean(axis=1),
        }


def special_token_mass(trace: AttentionTrace) -> SpecialTokenMass:
    """How much raw and norm-weighted attention lands on [CLS] and on [SEP], per (layer, head)."""
    flags = token_flags(trace.tokens)
    raw = np.asarray(trace.attentions, dtype=np.float64)
    weighted = norm_weighted_attention(raw, trace.value_norms)

    def share(matrix: np.ndarray, keys: np.ndarray) -> np.ndarray:
        total = matrix.sum(axis=(2, 3))
        return matrix[..., keys].sum(axis=(2, 3)) / np.where(total > 0, total, 1.0)

    return SpecialTokenMass(
        raw_cls=share(raw, flags["cls"]),
        raw_sep=share(raw, flags["sep"]),
        norm_cls=share(weighted, flags["cls"]),
        norm_sep=share(weighted, flags["sep"]),
    )
