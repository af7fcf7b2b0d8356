"""Per-head summary numbers for the heatmaps page: entropy, maximum weight, share to [CLS]/[SEP]."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model_core.trace import AttentionTrace

SPECIAL_TOKENS = ("[CLS]", "[SEP]")


@dataclass(frozen=True)
class HeadSummary:
    """Averages over query positions, one value per head.

    Shape: every field (layer, head).
    """

    entropy: np.ndarray
    max_weight: np.ndarray
    to_cls: np.ndarray
    to_sep: np.ndarray


def entropy_bits(weights: np.ndarray) -> np.ndarray:
    """Entropy in bits of each attention row (0·log 0 = 0). Shape: (..., k_pos) -> (...)."""
    w = np.asarray(weights, dtype=np.float64)
    logs = np.log2(np.where(w > 0, w, 1.0))
    return -(w * logs).sum(-1)


def head_summary(trace: AttentionTrace) -> HeadSummary:
    """Entropy (bits), the largest weight, and the share of attention to [CLS] and [SEP], per head."""
    att = trace.attentions  # (layer, head, q_pos, k_pos)
    tokens = np.array(trace.tokens)
    return HeadSummary(
        entropy=entropy_bits(att).mean(-1),
        max_weight=att.max(axis=(-1, -2)),
        to_cls=att[..., tokens == "[CLS]"].sum(-1).mean(-1),
        to_sep=att[..., tokens == "[SEP]"].sum(-1).mean(-1),
    )


def special_token_positions(tokens: tuple[str, ...]) -> list[int]:
    """Positions of [CLS] and [SEP]."""
    return [i for i, t in enumerate(tokens) if t in SPECIAL_TOKENS]


def pool_matrix(matrix: np.ndarray, size: int) -> np.ndarray:
    """Block-average a square matrix down to at most ``size`` x ``size`` (no-op when smaller).

    Both axes are averaged, so a pooled cell is the mean weight of its block. Shape: (n, n) -> (m, m), m = min(n, size).
    """
    n = matrix.shape[-1]
    if n <= size:
        return matrix
    edges = np.linspace(0, n, size + 1).round().astype(int)[:-1]
    counts = np.diff(np.append(edges, n))
    rows = np.add.reduceat(matrix, edges, axis=-2) / counts[:, None]
    return np.add.reduceat(rows, edges, axis=-1) / counts[None, :]
