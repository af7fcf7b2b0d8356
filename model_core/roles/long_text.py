"""Role scores on a long input's compact trace (``model_core.compact.trace``), with no n x n weights: previous-token and
sink are the statistics streamed while tracing; duplicate-token and induction read the exact weights at their
(query, key) pairs only."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from model_core.compact.trace import CompactTrace
from model_core.roles.scores import induction_pairs

PAIR_CHUNK = 32_768
"""Pairs whose weights are computed at once: 32,768 x a layer's heads x d_head floats, tens of MB."""


def duplicate_pairs(token_ids: np.ndarray, special: np.ndarray, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """Every (query, key) pair of two copies of one word (special tokens left out): each earlier copy on a causal
    model, every other copy on an encoder. Shape: (pos,) x 2 -> two (pairs,) int64 arrays."""
    by_token: dict[int, list[int]] = {}
    for pos, token in enumerate(np.asarray(token_ids).tolist()):
        if not special[pos]:
            by_token.setdefault(token, []).append(pos)
    queries, keys = [], []
    for positions in by_token.values():
        for i, q in enumerate(positions):
            others = positions[:i] if causal else positions[:i] + positions[i + 1:]
            queries += [q] * len(others)
            keys += others
    return np.asarray(queries, dtype=np.int64), np.asarray(keys, dtype=np.int64)


def _summed(trace: CompactTrace, q_pos: np.ndarray, k_pos: np.ndarray,
            progress: Callable[[float], None] | None, share: tuple[float, float]) -> np.ndarray:
    """Σ over the pairs of each head's weight. Shape: -> (layer, head) float64."""
    out = np.zeros((trace.n_layers, trace.n_heads))
    for layer in range(trace.n_layers):
        for c0 in range(0, len(q_pos), PAIR_CHUNK):
            out[layer] += trace.pair_weights(layer, q_pos[c0:c0 + PAIR_CHUNK], k_pos[c0:c0 + PAIR_CHUNK]).sum(-1)
        if progress is not None:
            progress(share[0] + share[1] * (layer + 1) / trace.n_layers)
    return out


def compact_role_scores(trace: CompactTrace, special: np.ndarray,
                        progress: Callable[[float], None] | None = None) -> dict[str, np.ndarray]:
    """``roles.scores.role_scores`` of the text roles and induction on a compact trace, each as its definition on a
    full trace: previous-token and sink from the streamed statistics (``to_prev``, ``to_first``); duplicate-token
    the mean over queries with an earlier copy of the weight on those copies; induction the mean weight of a
    repeated word on the token after its previous copy. NaN where the text has no repeat.

    Shape: special (pos,) bool -> each (layer, head) float64.
    """
    nan = np.full((trace.n_layers, trace.n_heads), np.nan)
    scores = {"previous_token": np.asarray(trace.stats["to_prev"], dtype=np.float64),
              "sink": np.asarray(trace.stats["to_first"], dtype=np.float64)}
    dq, dk = duplicate_pairs(trace.token_ids, special, trace.is_decoder)
    scores["duplicate_token"] = (_summed(trace, dq, dk, progress, (0.0, 0.8)) / len(np.unique(dq))
                                 if len(dq) else nan)
    iq, ik = induction_pairs(trace.token_ids, special)
    scores["induction"] = _summed(trace, iq, ik, progress, (0.8, 0.2)) / len(iq) if len(iq) else nan
    return scores
