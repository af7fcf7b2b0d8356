"""Attention beside effect: for every head, how hard it looks at the tokens the corruption changed, and how much
patching it matters. The head that looks hardest is not always the one that matters (Jain & Wallace 2019;
Kobayashi et al. 2020).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from model_core.effects.patching_attribution import rank_correlation
from model_core.trace.trace import AttentionTrace


@dataclass(frozen=True, eq=False)
class AttentionBesideEffect:
    """One row per head: its attention, its norm-weighted attention, its role scores, its direct logit attribution
    and its patching effect.

    Attributes:
        attention: the weight the last token puts on the tokens that differ between the prompts, summed over them,
            in the clean prompt's trace.
        norm_weighted: the same share of the last token's norm-weighted attention (α_ij·‖v_j W_Oʰ‖, Kobayashi et al.
            2020): Σ over the differing keys divided by Σ over all keys.
        effect: exact patching's effect (NaN where a stopped run did not get to it).
        attribution: attribution patching's estimate of it.
        dla: direct logit attribution of each head to logit(answer) − logit(foil), or None where not computed.
        roles: role name -> its score grid (previous-token, duplicate-token, sink on the clean prompt...).
        differing: the positions the attention is read at.

    Shape: every grid (layer, head).
    """

    attention: np.ndarray
    norm_weighted: np.ndarray
    effect: np.ndarray
    attribution: np.ndarray
    dla: np.ndarray | None = None
    roles: dict[str, np.ndarray] = field(default_factory=dict)
    differing: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        grids = [self.attention, self.norm_weighted, self.effect, self.attribution, *self.roles.values()]
        if self.dla is not None:
            grids.append(self.dla)
        if len({np.shape(g) for g in grids}) != 1:
            raise ValueError(f"Every grid must be (layer, head) of one shape; got {[np.shape(g) for g in grids]}.")

    @property
    def shape(self) -> tuple[int, int]:
        return self.attention.shape  # type: ignore[return-value]

    def attention_correlation(self, estimate: bool = False) -> float:
        """Spearman's ρ of each head's attention with its |effect| (the scatter's), or with attribution patching's
        |estimate| when ``estimate`` (before exact patching has run)."""
        return rank_correlation(self.attention, np.abs(self.attribution if estimate else self.effect))

    def correlations(self) -> dict[str, float]:
        """Spearman's rank correlations of the attention columns with the effect (signed and absolute), and of
        attribution patching with exact patching."""
        out = {"attention_vs_effect": rank_correlation(self.attention, self.effect),
               "attention_vs_abs_effect": self.attention_correlation(),
               "norm_weighted_vs_abs_effect": rank_correlation(self.norm_weighted, np.abs(self.effect)),
               "attribution_vs_effect": rank_correlation(self.attribution, self.effect)}
        if self.dla is not None:
            out["dla_vs_effect"] = rank_correlation(self.dla, self.effect)
        return out

    def to_rows(self) -> list[dict[str, Any]]:
        """One dict per head, largest |effect| first (heads not yet patched last)."""
        layers, heads = self.shape
        rows = []
        for layer in range(layers):
            for head in range(heads):
                row: dict[str, Any] = {"layer": layer, "head": head,
                                       "attention": float(self.attention[layer, head]),
                                       "norm_weighted": float(self.norm_weighted[layer, head])}
                row |= {role: float(grid[layer, head]) for role, grid in self.roles.items()}
                row["dla"] = float(self.dla[layer, head]) if self.dla is not None else float("nan")
                row["attribution"] = float(self.attribution[layer, head])
                row["effect"] = float(self.effect[layer, head])
                rows.append(row)
        return sorted(rows, key=lambda r: -abs(r["effect"]) if np.isfinite(r["effect"]) else np.inf)


def attention_to(trace: AttentionTrace, keys: np.ndarray, query: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Each head's raw and norm-weighted attention from ``query`` to ``keys``, summed over them; the norm-weighted
    one as a share of that query's whole norm-weighted attention.

    Shape: keys (k,) -> raw (layer, head), norm-weighted share (layer, head).
    """
    keys = np.asarray(keys, dtype=np.int64)
    row = np.asarray(trace.weights[:, :, query, :], dtype=np.float64)  # (layer, head, k_pos)
    raw = row[:, :, keys].sum(axis=-1)
    weighted = row * np.asarray(trace.value_norms, dtype=np.float64)  # α_ij · ‖v_j W_Oʰ‖
    total = weighted.sum(axis=-1)
    share = weighted[:, :, keys].sum(axis=-1) / np.where(total > 0, total, 1.0)
    return raw, share


def attention_beside_effect(trace: AttentionTrace, differing: np.ndarray, effect: np.ndarray,
                            attribution: np.ndarray, *, dla: np.ndarray | None = None,
                            roles: dict[str, np.ndarray] | None = None) -> AttentionBesideEffect:
    """The table from the clean prompt's trace (its last token's attention to the ``differing`` positions) and the
    patching grids.

    Raises:
        ValueError: the trace is not the clean prompt's (its length does not cover ``differing``), or a grid's shape
            is not the trace's (layer, head).
    """
    differing = np.asarray(differing, dtype=np.int64)
    if differing.size == 0 or differing.max() >= trace.n_tokens:
        raise ValueError(f"The differing positions {differing.tolist()} do not fit the trace's {trace.n_tokens} "
                         "tokens; pass the clean prompt's trace.")
    raw, share = attention_to(trace, differing)
    return AttentionBesideEffect(raw, share, np.asarray(effect, dtype=np.float64),
                                 np.asarray(attribution, dtype=np.float64),
                                 None if dla is None else np.asarray(dla, dtype=np.float64),
                                 {k: np.asarray(v, dtype=np.float64) for k, v in (roles or {}).items()},
                                 tuple(int(i) for i in differing))
