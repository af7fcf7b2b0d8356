"""Role scores of one input: previous-token, duplicate-token, induction and sink, one number per (layer, head).

Each score is the mean, over the query positions that count for the role, of the weight the query puts on the
role's target keys (TransformerLens's ``head_detector``: the attention mass on the detection pattern, divided by
the number of counted rows). Previous-token and sink are the same numbers as Clark et al.'s head statistics
``to_prev`` and ``to_cls`` (``model_core.analysis.head_stats()``; a test holds them equal); here they are computed
from bare weights, because the probe's batch of texts is not a trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model_core.analysis._common import trace_flags
from model_core.trace.trace import AttentionTrace

PROBE_ROLES: tuple[str, ...] = ("previous_token", "duplicate_token", "induction", "sink")
"""The roles scored from the repeated random sequences (``model_core.roles.probes``)."""

TEXT_ROLES: tuple[str, ...] = ("previous_token", "duplicate_token", "sink")
"""The roles that mean something on any text (induction needs a repeat, retrieval a needle)."""


@dataclass(frozen=True, eq=False)
class RoleInput:
    """What the scores read of one input: its weights, token ids, which tokens are special, and the mask.

    Shape: weights (layer, head, q_pos, k_pos); token_ids, special (pos,); mask (q_pos, k_pos) bool.
    """

    weights: np.ndarray
    token_ids: np.ndarray
    special: np.ndarray
    mask: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if self.weights.ndim != 4 or self.weights.shape[2:] != (n, n) or self.mask.shape != (n, n) \
                or self.special.shape != (n,):
            raise ValueError(f"weights {self.weights.shape}, mask {self.mask.shape} and special "
                             f"{self.special.shape} do not fit {n} tokens.")

    @classmethod
    def from_trace(cls, trace: AttentionTrace) -> RoleInput:
        """A trace's weights, ids, special tokens (as its family reads them) and mask."""
        return cls(np.asarray(trace.weights), np.asarray(trace.token_ids), trace_flags(trace)["special"],
                   np.asarray(trace.mask, dtype=bool))

    @property
    def grid_shape(self) -> tuple[int, int]:
        return self.weights.shape[:2]  # type: ignore[return-value]


def duplicate_pattern(x: RoleInput) -> np.ndarray:
    """Which keys hold another copy of the query's token: same token id, both words, visible, not the query.

    On a causal model that is every earlier occurrence; a bidirectional model sees later ones too, and they count.

    Shape: (q_pos, k_pos) bool.
    """
    ids, ok = np.asarray(x.token_ids), ~np.asarray(x.special)
    same = (ids[:, None] == ids[None, :]) & ok[:, None] & ok[None, :] & x.mask
    np.fill_diagonal(same, False)
    return same


def induction_targets(x: RoleInput) -> tuple[np.ndarray, np.ndarray]:
    """Olsson et al.'s (query, key) pairs of ``x`` (``induction_pairs``)."""
    return induction_pairs(np.asarray(x.token_ids), np.asarray(x.special))


def induction_pairs(token_ids: np.ndarray, special: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Olsson et al.'s (query, key) pairs: a word whose token occurred earlier, and the token just after that
    earlier occurrence (the most recent one), when that token is not the query itself.

    Shape: token_ids, special (pos,) -> two (pairs,) int64 arrays of query and key positions.
    """
    ok = ~np.asarray(special)
    last_seen: dict[int, int] = {}
    queries, keys = [], []
    for q, token in enumerate(np.asarray(token_ids).tolist()):
        p = last_seen.get(token) if ok[q] else None
        if p is not None and p + 1 < q:
            queries.append(q)
            keys.append(p + 1)
        if ok[q]:
            last_seen[token] = q
    return np.asarray(queries, dtype=np.int64), np.asarray(keys, dtype=np.int64)


def previous_token_scores(x: RoleInput) -> np.ndarray:
    """Mean over queries i >= 1 of the weight on i - 1 (``HeadStats.to_prev``). Shape: (layer, head) float64."""
    if len(x.token_ids) < 2:
        return np.full(x.grid_shape, np.nan)
    return np.diagonal(x.weights, offset=-1, axis1=2, axis2=3).mean(axis=-1, dtype=np.float64)


def sink_scores(x: RoleInput) -> np.ndarray:
    """Mean over every query of the weight on position 0, the first token or [CLS] (``HeadStats.to_cls``).

    Shape: (layer, head) float64.
    """
    return x.weights[..., 0].mean(axis=-1, dtype=np.float64)


def duplicate_token_scores(x: RoleInput) -> np.ndarray:
    """Mean over queries that have a duplicate of the weight on their duplicates; NaN when no token repeats.

    Shape: (layer, head) float64.
    """
    same = duplicate_pattern(x)
    rows = same.any(axis=1)
    if not rows.any():
        return np.full(x.grid_shape, np.nan)
    pattern = same[rows].astype(np.float64)  # (query, k_pos)
    return np.stack([np.einsum("hqk,qk->h", layer[:, rows].astype(np.float64), pattern) / rows.sum()
                     for layer in x.weights])


def induction_scores(x: RoleInput) -> np.ndarray:
    """Mean over ``induction_targets`` of the weight on the token after the earlier occurrence; NaN without a repeat.

    Shape: (layer, head) float64.
    """
    queries, keys = induction_targets(x)
    if not len(queries):
        return np.full(x.grid_shape, np.nan)
    return x.weights[:, :, queries, keys].astype(np.float64).mean(axis=-1)


_SCORERS = {"previous_token": previous_token_scores, "duplicate_token": duplicate_token_scores,
            "induction": induction_scores, "sink": sink_scores}


def role_scores(x: RoleInput | AttentionTrace, roles: tuple[str, ...] = PROBE_ROLES) -> dict[str, np.ndarray]:
    """Every role of ``roles`` scored on one input (a ``RoleInput`` or a trace).

    Shape: each (layer, head) float64.
    """
    unknown = set(roles) - set(_SCORERS)
    if unknown:
        raise ValueError(f"Unknown roles {sorted(unknown)}; one input scores {', '.join(_SCORERS)}.")
    x = RoleInput.from_trace(x) if isinstance(x, AttentionTrace) else x
    return {role: _SCORERS[role](x) for role in roles}
