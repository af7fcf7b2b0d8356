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

from model_core.analysis._common import markers, trace_flags
from model_core.trace.trace import AttentionTrace


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
    """Share of attention that goes to [CLS] and [SEP], raw and norm-weighted (a decoder's: to the first token
    and to its other special tokens; see ``_common.trace_flags``).

    Each share is the mass on those keys divided by the total mass, summed over all queries.

    Attributes:
        raw_cls: Shape: (layer, head).
        raw_sep: Shape: (layer, head).
        norm_cls: Shape: (layer, head).
        norm_sep: Shape: (layer, head).
        cls_label: the name of the "cls" keys in legends: "[CLS]", or "first token".
        sep_label: the name of the "sep" keys: "[SEP]", or "other special tokens".
        has_sep: whether the input has any "sep" key (a decoder's plain text has none: its shares are 0 and
            ``per_layer`` leaves them out).
    """

    raw_cls: np.ndarray
    raw_sep: np.ndarray
    norm_cls: np.ndarray
    norm_sep: np.ndarray
    cls_label: str = "[CLS]"
    sep_label: str = "[SEP]"
    has_sep: bool = True

    def __post_init__(self) -> None:
        shapes = {a.shape for a in (self.raw_cls, self.raw_sep, self.norm_cls, self.norm_sep)}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2:
            raise ValueError("Every share must be a (layer, head) array of the same shape.")

    def per_layer(self) -> dict[str, np.ndarray]:
        """Mean over heads of each share, named "raw [CLS]", "norm-weighted [SEP]"... Shape: each (layer,)."""
        out = {}
        for kind, cls, sep in (("raw", self.raw_cls, self.raw_sep), ("norm-weighted", self.norm_cls, self.norm_sep)):
            out[f"{kind} {self.cls_label}"] = cls.mean(axis=1)
            if self.has_sep:
                out[f"{kind} {self.sep_label}"] = sep.mean(axis=1)
        return out


def special_token_mass(trace: AttentionTrace) -> SpecialTokenMass:
    """How much raw and norm-weighted attention lands on [CLS] and on [SEP] (a decoder's first token and other
    special tokens), per (layer, head). Grouped-query heads need nothing special: the trace's value norms are
    already per query head."""
    flags = trace_flags(trace)
    names = markers(trace)
    # Summed over queries first: the norm-weighted mass on key j is ‖f(x_j)‖ · Σ_i α_ij, so one pass over the
    # weights (float32 in, float64 sums) replaces a float64 copy of every norm-weighted matrix (4 s at 512 tokens
    # of SmolLM2 on a busy 2-core machine).
    raw = np.sum(trace.weights, axis=2, dtype=np.float64)  # (layer, head, k_pos)
    weighted = raw * np.asarray(trace.value_norms, dtype=np.float64)

    def share(mass: np.ndarray, keys: np.ndarray) -> np.ndarray:
        total = mass.sum(axis=-1)
        return mass[..., keys].sum(axis=-1) / np.where(total > 0, total, 1.0)

    return SpecialTokenMass(
        raw_cls=share(raw, flags["cls"]),
        raw_sep=share(raw, flags["sep"]),
        norm_cls=share(weighted, flags["cls"]),
        norm_sep=share(weighted, flags["sep"]),
        cls_label=names.first_short,
        sep_label=names.sep,
        has_sep=bool(flags["sep"].any()),
    )
