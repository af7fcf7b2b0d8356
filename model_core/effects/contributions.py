"""Contributions (Ferrando & Voita 2024, "information flow routes"): each part's proximity share of a block's output,
and the paper's renormalising threshold.

A part's proximity to a whole is ``max(‖whole‖₁ − ‖part − whole‖₁, EPS)``; its contribution is that normalised over
all the parts of the whole (llm-transparency-tool's floor ``EPS``). The attention block's parts at query ``i`` are
its (key, head) terms and the residual entering it; only terms whose weight is non-zero are parts (a masked key,
a switched-off head, write nothing), so a causal row of ``i + 1`` keys has ``(i + 1) · H`` term parts.

The terms' proximities cost ``n · H · d`` per query row. ``term_proximity`` computes them exactly without touching
every dimension of every term: with ``s = sign(w)``, ``‖w − αu‖₁ = ‖w‖₁ − α s·u + 2 Σ_d relu(α s_d u_d − |w_d|)``,
so the proximity is a matrix product minus a correction that is non-zero only on dimensions where the term
overshoots the whole. The correction is summed exactly over each row's few smallest ``|w_d|``; a term
that could overshoot any other dimension (``α‖u‖∞`` above the row's threshold) is computed in full.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

EPS = 1e-5
"""The floor of a part's proximity (llm-transparency-tool's)."""
FRAGILE_OPTIONS = (8, 16, 32, 64)
"""Dimensions per query row where the exact correction is summed for every term (the rest only for large terms):
``term_proximity`` takes the option with the least work for its rows."""
BIG_TERM_COST = 2
"""A term computed in full costs this many times a dense element per dimension (it is gathered)."""
CHUNK_ELEMENTS = 4_000_000
"""Elements of the correction's (rows, dims, head, key) tensor per chunk: about 16 MB of float32."""


def proximity(parts: torch.Tensor, whole: torch.Tensor) -> torch.Tensor:
    """Each part's proximity to the whole, ``max(‖whole‖₁ − ‖part − whole‖₁, EPS)``, not normalised.

    Shape: parts (part, ..., d), whole (..., d) -> (part, ...).
    """
    return (whole.abs().sum(-1) - (parts - whole).abs().sum(-1)).clamp_min(EPS)


def shares(parts: torch.Tensor, whole: torch.Tensor) -> torch.Tensor:
    """Each part's contribution: its proximity over the sum of all the parts'. Shape: as ``proximity``."""
    p = proximity(parts, whole)
    return p / p.sum(0, keepdim=True)


@torch.no_grad()
def term_proximity(weights: torch.Tensor, directions: torch.Tensor, whole: torch.Tensor,
                   fragile: int | None = None) -> torch.Tensor:
    """Exact proximities of the terms ``weights[r, h, k] · directions[h, :, k]`` to ``whole[r]``, before the floor.

    Args:
        weights: each term's scalar (attention weight times the row's frozen-norm scale).
        directions: each (head, key) term's direction, keys last.
        whole: each row's whole (the residual after the block).
        fragile: dimensions per row where every term's correction is summed (None: the cheapest option).

    Shape: weights (rows, head, key), directions (head, d, key), whole (rows, d) -> (rows, head, key).
    """
    n_heads, d, n_keys = directions.shape
    rows = len(whole)
    sign = torch.where(whole >= 0, 1.0, -1.0).to(whole.dtype)  # (rows, d); sign 0 counts as +: the identity holds
    prox = weights * torch.matmul(sign, directions).transpose(0, 1)  # α · s·u: (rows, head, key)
    # each term direction's largest |u_d|, from two reductions over d (no |u| copy). Shape: (head, key).
    largest = torch.maximum(directions.amax(1), -directions.amin(1))
    if fragile is None:
        fragile = _cheapest_fragile(weights, largest, whole)
    if fragile >= d:  # every dimension is summed exactly
        small, idx = whole.abs().sort(dim=-1)
        tau = torch.full((rows,), float("inf"), dtype=whole.dtype, device=whole.device)
    else:
        small, idx = whole.abs().topk(fragile, dim=-1, largest=False)  # (rows, f), ascending
        tau = small[:, -1]  # every other dimension has |w_d| >= tau
    # Many rows: s_d · u_d gathered in one step from [u; −u] (the index points into the negated half where w_d < 0);
    # a few rows: gathered, then multiplied by the sign (cheaper than building [u; −u]).
    many = rows * small.shape[1] > 2 * d
    both = torch.cat([directions, -directions], dim=1) if many else directions  # (head, 2d or d, key)
    signed_idx = idx + d * (sign.gather(1, idx) < 0) if many else idx
    step = max(1, CHUNK_ELEMENTS // max(1, small.shape[1] * n_heads * n_keys))
    by_head = weights.transpose(0, 1)[:, :, None]  # (head, rows, 1, key)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        signed = both[:, signed_idx[r0:r1]]  # (head, r, f, key): s_d · u_d on the row's fragile dimensions
        if not many:
            signed *= sign[r0:r1].gather(1, idx[r0:r1])[None, :, :, None]
        over = torch.addcmul(-small[None, r0:r1, :, None], by_head[:, r0:r1], signed).clamp_min_(0).sum(2)
        prox[r0:r1] -= 2 * over.transpose(0, 1)
    if fragile < d:  # terms that may overshoot a dimension outside the fragile ones: in full
        r, h, k = (weights * largest > tau[:, None, None]).nonzero(as_tuple=True)
        for p0 in range(0, len(r), 4096):
            rr, hh, kk = r[p0:p0 + 4096], h[p0:p0 + 4096], k[p0:p0 + 4096]
            w = whole[rr]
            term = weights[rr, hh, kk, None] * directions[hh, :, kk]  # (pairs, d)
            prox[rr, hh, kk] = w.abs().sum(-1) - (term - w).abs().sum(-1)
    return prox


def _cheapest_fragile(weights: torch.Tensor, largest: torch.Tensor, whole: torch.Tensor) -> int:
    """The fragile-dimension count with the least work: ``f`` per term densely, plus ``d`` per term that may
    overshoot elsewhere (those whose ``α·‖u‖∞`` passes the row's ``f``-th smallest ``|w_d|``)."""
    d = whole.shape[-1]
    options = [f for f in FRAGILE_OPTIONS if f < d]
    if not options:
        return d
    small = whole.abs().topk(max(options), dim=-1, largest=False).values  # (rows, f), ascending
    reach = weights * largest  # (rows, head, key)
    big = torch.stack([(reach > small[:, f - 1, None, None]).sum() for f in options]).tolist()  # one copy
    cost = {f: f * reach.numel() + BIG_TERM_COST * d * n for f, n in zip(options, big)}
    return min(cost, key=cost.get)


@torch.no_grad()
def attention_shares(weights: torch.Tensor, directions: torch.Tensor, whole: torch.Tensor,
                     residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The attention block's contributions at some query rows: each (head, key) term's and the residual's.

    Terms with a zero weight are not parts (their contribution is 0). The shares of a row sum to 1.

    Shape: weights (rows, head, key), directions (head, d, key), whole, residual (rows, d) ->
        terms (rows, head, key), residual (rows,).
    """
    terms = term_proximity(weights, directions, whole).clamp_min_(EPS) * (weights != 0)
    res = proximity(residual[None], whole)[0]
    total = terms.sum((1, 2)) + res
    return terms / total[:, None, None], res / total


def renormalise(parts: np.ndarray, residual: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """The paper's renormalising threshold: zero every part and residual share ≤ ``threshold``, then divide each
    node's survivors by their own sum. A node with nothing above the threshold keeps all zeros (never NaN).

    Shape: parts (node, ...), residual (node,) -> the same shapes.
    """
    parts = np.where(parts > threshold, parts, 0.0).astype(np.float32)
    residual = np.where(residual > threshold, residual, 0.0).astype(np.float32)
    total = parts.reshape(len(parts), -1).sum(1) + residual
    safe = np.where(total > 0, total, 1.0)
    shape = (-1,) + (1,) * (parts.ndim - 1)
    return parts / safe.reshape(shape), residual / safe


@dataclass(frozen=True, eq=False)
class LayerContributions:
    """Every node's contributions in one layer (no threshold applied): the attention block's and the MLP block's.

    Attributes:
        layer: the layer.
        attention_heads: each query's (key, head) term shares, ``[to][from][head]``. Shape: (q_pos, k_pos, head).
        attention_residual: the residual's share of each query's resid_mid. Shape: (pos,).
        ffn: the MLP output's share of each resid_post. Shape: (pos,).
        ffn_residual: resid_mid's share of each resid_post. Shape: (pos,).
    """

    layer: int
    attention_heads: np.ndarray
    attention_residual: np.ndarray
    ffn: np.ndarray
    ffn_residual: np.ndarray

    def thresholded(self, threshold: float) -> LayerContributions:
        """The same contributions after the renormalising threshold (``renormalise``), per block."""
        heads, res = renormalise(self.attention_heads, self.attention_residual, threshold)
        ffn, ffn_res = renormalise(self.ffn[:, None], self.ffn_residual, threshold)
        return LayerContributions(self.layer, heads, res, ffn[:, 0], ffn_res)

    @property
    def attention(self) -> np.ndarray:
        """Each query's key shares summed over heads, ``[to][from]``. Shape: (q_pos, k_pos)."""
        return self.attention_heads.sum(-1)

    def to_json(self, full: bool = True) -> dict:
        """The CLI's record of this layer; ``full=False`` leaves the n × n matrices out."""
        out = {"attention_residual": self.attention_residual.tolist(), "ffn": self.ffn.tolist(),
               "ffn_residual": self.ffn_residual.tolist()}
        if full:
            out = {"attention": self.attention.tolist(), "attention_heads": self.attention_heads.tolist(), **out}
        return out


def head_shares(terms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A head map's contributions on attention's footing: each head's (key) terms as a share of that head's own
    terms in the row (so a head row sums to 1, as its attention weights do), and each head's share of the row's
    terms (its part of the attention block's non-residual mass). Rows or heads with no terms give 0, never NaN.

    Shape: terms (rows, head, key): each (head, key) term's contribution -> within (rows, head, key),
        of_terms (rows, head).
    """
    terms = np.asarray(terms, dtype=np.float32)
    per_head = terms.sum(-1)  # (rows, head)
    within = terms / np.where(per_head > 0, per_head, 1.0)[..., None]
    per_row = per_head.sum(-1, keepdims=True)
    return within, per_head / np.where(per_row > 0, per_row, 1.0)
