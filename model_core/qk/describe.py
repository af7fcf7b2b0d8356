"""The QK split in words: "the query's L0 MLP × the key's L16 H0 (a previous-token head) gives +3.6 of the score's
+3.7"."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from model_core.qk.terms import QKTerms


def component_label(name: str, roles: Mapping[str, str] | None = None) -> str:
    """"L3H5" -> "L3 H5" (with its role, "(a previous-token head)", where ``roles`` names one); "L3MLP" -> "L3 MLP"."""
    if name.startswith("L") and "H" in name:
        layer, head = name[1:].split("H")
        label = f"L{layer} H{head}"
        role = (roles or {}).get(name)
        return f"{label} ({role})" if role else label
    if name.startswith("L") and name.endswith("MLP"):
        return f"{name[:-3]} MLP"
    return {"embed": "token embedding", "pos": "position embedding", "bias": "constant biases"}.get(name, name)


ROLE_WORDS = {"previous_token": "a previous-token head", "duplicate_token": "a duplicate-token head",
              "induction": "an induction head", "sink": "a sink head"}
ROLE_THRESHOLD = 0.4
"""A head is named for its strongest role when that role's score (the probe's mean attention) is at least this."""


def role_labels(scores: Mapping[str, np.ndarray], threshold: float = ROLE_THRESHOLD) -> dict[str, str]:
    """Component name ("L3H5") -> its role in words, for heads whose strongest role scores at least ``threshold``.

    Args:
        scores: role -> (layer, head) scores (``model_core.roles.RoleScores.scores``).
    """
    known = {role: np.nan_to_num(np.asarray(grid, dtype=np.float64), nan=-np.inf)
             for role, grid in scores.items() if role in ROLE_WORDS}
    if not known:
        return {}
    roles = list(known)
    stacked = np.stack([known[r] for r in roles])  # (role, layer, head)
    best, value = stacked.argmax(0), stacked.max(0)
    return {f"L{layer}H{head}": ROLE_WORDS[roles[int(best[layer, head])]]
            for layer, head in zip(*np.nonzero(value >= threshold))}


def describe_pairs(result: QKTerms, terms: np.ndarray, total: float, n: int = 3,
                   roles: Mapping[str, str] | None = None) -> list[str]:
    """The ``n`` largest terms in words, each with its share of ``total``."""
    lines = []
    for qc, kc, value in result.top_pairs(n, terms):
        lines.append(f"the query's {component_label(qc, roles)} × the key's {component_label(kc, roles)} gives "
                     f"{value:+.2f} of {total:+.2f}")
    return lines


def describe(result: QKTerms, roles: Mapping[str, str] | None = None, n: int = 3) -> list[str]:
    """A few lines: the score and weight, its top pairs, and why this key rather than the runner-up."""
    tok = result.tokens
    lines = [(f"L{result.layer} H{result.head}: query {result.query} ({tok[result.query]!r}) -> key {result.key} "
              f"({tok[result.key]!r}): score {result.score:+.3f}, weight {result.weight:.3f}")]
    if result.softcap is not None:
        lines.append(f"(the score is split before the softcap {result.softcap:g}; capped it is "
                     f"{result.capped_score:+.3f})")
    lines += ["  " + s for s in describe_pairs(result, result.terms, result.score, n, roles)]
    v = result.versus
    if v is not None:
        lines.append(f"versus key {v.key} ({tok[v.key]!r}): score {v.score:+.3f}, weight {v.weight:.3f}, "
                     f"log-odds {v.log_odds:+.3f}")
        diff = result.terms - v.terms
        lines += ["  " + s for s in describe_pairs(result, diff, result.score - v.score, n, roles)]
    return lines
