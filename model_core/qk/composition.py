"""Composition scores (Elhage et al., 2021), from the weights alone: how much each earlier head's write (its OV
circuit) feeds each later head's query, key or value side, as TransformerLens's ``all_composition_scores`` computes
them, with the random-matrix baseline of the TransformerLens (ARENA) tutorial beside them.

In TransformerLens's row convention (``W_OV = W_V W_O``, ``W_QK = W_Q W_K^T``, both (d_model, d_model)), for an earlier
head h1 and a later head h2::

    Q-composition = ||W_OV^h1 W_QK^h2||_F   / (||W_OV^h1||_F ||W_QK^h2||_F)
    K-composition = ||W_OV^h1 W_QK^h2 T||_F / (||W_OV^h1||_F ||W_QK^h2||_F)
    V-composition = ||W_OV^h1 W_OV^h2||_F   / (||W_OV^h1||_F ||W_OV^h2||_F)

What is folded in (``fold_heads``), as TransformerLens's ``fold_ln`` and ``center_writing_weights`` do, and what is not:

- the norm before each layer's attention: its per-feature scale (Gemma's ``1 + weight``) multiplies the rows of that
  layer's W_Q, W_K and W_V; a LayerNorm also centres them (the norm removes the mean of what it reads);
- a LayerNorm model's W_O is centred too (what it writes loses its mean at every later norm);
- Gemma 2/3's norm of the attention output: its scale multiplies W_O's columns; the per-head query/key norms of
  Qwen3 and Gemma 3: their scales multiply W_Q's and W_K's columns;
- not folded: the norms' division by each position's rms or std, the rotary embedding (both depend on the position,
  as in the paper), the biases, and a post-LN model's norms (BERT, the chapter-3 encoder with post-LN: its weights
  are read as they are).

Speed: no (d_model, d_model) matrix is formed. ``||A1 B1 E2 T2||_F`` (A1 = W_V of h1, B1 = its W_O) is computed as
``||R_A1 (B1 E2) T2||_F`` with R_A1 the (d_head, d_head) factor of A1's QR decomposition: one matrix product of
(d_head, d_model) by (d_model, d_head) blocks per pair, batched per source layer into one GEMM; keys and values
shared by several query heads (grouped-query attention) are multiplied once and the heads' own factor enters through
its (d_head, d_head) Gram matrix. SmolLM2-135M's 270 heads cost about 280 GFLOP of float32 products, a few seconds
on 2 idle cores (``bench/bench_composition.py`` prints the time).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch

from model_core.families.weights import LayerWeights, layer_weights
from model_core.gate import checkpoint
from model_core.trace.resolve import resolve

KINDS = ("q", "k", "v")
KIND_TITLES = {"q": "Q-composition", "k": "K-composition", "v": "V-composition"}
BASELINE_SAMPLES = 100
"""Random pairs of matrices drawn for the baseline (the tutorial draws 200 to 300; the scores of random pairs vary so
little, a standard deviation near 1% of their mean, that 100 pin the mean to about 0.1%)."""
PRODUCT_FLOATS = 1 << 24
"""The largest block of products formed at once (64 MB in float32); a larger model takes its later layers in chunks."""


class CompositionPair(NamedTuple):
    """One (earlier head, later head) pair and its score; ``ratio``: the score over the random baseline."""

    kind: str
    source_layer: int
    source_head: int
    target_layer: int
    target_head: int
    score: float
    ratio: float


@dataclass(frozen=True, eq=False)
class CompositionScores:
    """Q-, K- and V-composition of every earlier head into every later head.

    Attributes:
        q, k, v: (layer * head, layer * head) float64, read-only; row: the earlier head, column: the later head, both
            flattened layer-major (index ``layer * n_heads + head``); NaN where the pair cannot compose (the row's
            layer is not before the column's).
        baseline: kind -> the mean score of random matrices of the same shapes (seeded).
        baseline_std: kind -> their standard deviation.
        n_layers, n_heads: the model's shape.
        folded: what was folded into the weights, in words (see the module's docstring).
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    baseline: dict[str, float]
    n_layers: int
    n_heads: int
    baseline_std: dict[str, float] = field(default_factory=dict)
    folded: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = self.n_layers * self.n_heads
        for kind in KINDS:
            grid = np.asarray(getattr(self, kind), dtype=np.float64)
            if grid.shape != (n, n):
                raise ValueError(f"{kind} must be ({n}, {n}) for {self.n_layers} layers x {self.n_heads} heads, "
                                 f"got {grid.shape}.")
            grid = grid.copy()
            grid.flags.writeable = False
            object.__setattr__(self, kind, grid)
        if set(self.baseline) != set(KINDS):
            raise ValueError(f"baseline needs the keys {KINDS}, got {sorted(self.baseline)}.")

    def scores(self, kind: str) -> np.ndarray:
        """One kind's (layer * head, layer * head) grid. Raises ValueError for a kind not in ``KINDS``."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
        return getattr(self, kind)

    def labels(self) -> list[str]:
        """"L{layer}H{head}" of every row and column, layer-major."""
        return [f"L{layer}H{head}" for layer in range(self.n_layers) for head in range(self.n_heads)]

    def top_pairs(self, kind: str, n: int = 10) -> list[CompositionPair]:
        """The ``n`` pairs with the highest scores of ``kind``, highest first (ties: the earlier pair first)."""
        grid = self.scores(kind)
        flat = np.where(np.isfinite(grid), grid, -np.inf).ravel()
        order = np.argsort(-flat, kind="stable")[: max(0, n)]
        base = self.baseline[kind]
        pairs = []
        for index in order:
            if not np.isfinite(flat[index]):
                break
            row, col = divmod(int(index), grid.shape[1])
            score = float(flat[index])
            pairs.append(CompositionPair(kind, *divmod(row, self.n_heads), *divmod(col, self.n_heads), score,
                                         score / base if base > 0 else float("nan")))
        return pairs

    def to_json(self) -> dict[str, Any]:
        """``{"q": LH x LH, "k": ..., "v": ..., "baseline": {"q", "k", "v"}}``: null where a pair cannot compose,
        full float precision."""
        grid = lambda a: [[float(x) if np.isfinite(x) else None for x in row] for row in a.tolist()]
        return {**{kind: grid(getattr(self, kind)) for kind in KINDS},
                "baseline": {kind: float(self.baseline[kind]) for kind in KINDS}}


# -- folding ----------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class FoldedHeads:
    """Every head's weights with the norms folded in (``fold_heads``), stacked layer-major, in one dtype.

    Shape: W_Q (layer * head, d_model, d_head); W_K, W_V (layer, kv_head, d_model, d_head);
    W_O (layer * head, d_head, d_model); kv_of_head (head,) the key/value head each query head reads.
    """

    W_Q: torch.Tensor
    W_K: torch.Tensor
    W_V: torch.Tensor
    W_O: torch.Tensor
    kv_of_head: torch.Tensor
    folded: tuple[str, ...]

    @property
    def n_layers(self) -> int:
        return int(self.W_K.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.W_Q.shape[0]) // self.n_layers

    def head_kv(self) -> torch.Tensor:
        """For every head (layer-major) its key/value head's index into ``W_K.flatten(0, 1)``.

        Shape: (layer * head,).
        """
        layers = torch.arange(self.n_layers, device=self.W_Q.device).repeat_interleave(self.n_heads)
        return layers * self.W_K.shape[1] + self.kv_of_head.repeat(self.n_layers)

    def ov(self, index: int) -> torch.Tensor:
        """Head ``index``'s (d_model, d_model) W_OV = W_V W_O (for references and tests, not the fast path)."""
        return self.W_V.flatten(0, 1)[self.head_kv()[index]].double() @ self.W_O[index].double()

    def qk(self, index: int) -> torch.Tensor:
        """Head ``index``'s (d_model, d_model) W_QK = W_Q W_K^T."""
        return self.W_Q[index].double() @ self.W_K.flatten(0, 1)[self.head_kv()[index]].double().T


def fold_heads(weights: Sequence[LayerWeights], dtype: torch.dtype = torch.float32) -> FoldedHeads:
    """The weights composition reads, in ``dtype``: the norms' scales folded in and a LayerNorm model's weights
    centred, as the module's docstring lists. Raises ValueError when the layers differ in shape."""
    if not weights:
        raise ValueError("A model with no layers has no heads to compose.")
    kv = weights[0].kv_of_head
    if any(w.W_Q.shape != weights[0].W_Q.shape or w.W_K.shape != weights[0].W_K.shape or w.kv_of_head != kv
           for w in weights):
        raise ValueError("Composition scores need every layer to have the same heads and shapes.")
    layer_norm = all(w.ln1_kind == "layer" for w in weights)
    # Whole stacks at once: a few large operations, not a few small ones a layer (torch's threads wait for each other
    # at every operation, which costs most when other processes hold the cores).
    W_Q, W_K, W_V, W_O = (_stacked(weights, name, dtype) for name in ("W_Q", "W_K", "W_V", "W_O"))  # (layer, ...)
    ln1 = _stacked(weights, "ln1_w", dtype)  # (layer, d_model): the norm's scale on each input feature
    if ln1 is not None:
        W_Q, W_K, W_V = (W * ln1[:, None, :, None] for W in (W_Q, W_K, W_V))
    centred = torch.tensor([w.ln1_kind == "layer" for w in weights], device=W_Q.device)
    if centred.any():  # a LayerNorm centres its input: only the centred part of W is read
        W_Q, W_K, W_V = (W - W.mean(dim=2, keepdim=True) * centred[:, None, None, None] for W in (W_Q, W_K, W_V))
    q_norm, k_norm = _stacked(weights, "q_norm_w", dtype), _stacked(weights, "k_norm_w", dtype)  # (layer, head, d_head)
    if q_norm is not None:
        W_Q = W_Q * q_norm[:, :, None, :]
    if k_norm is not None:
        W_K = W_K * k_norm[:, :, None, :]
    out_norm = _stacked(weights, "out_norm_w", dtype)  # (layer, d_model)
    if out_norm is not None:
        W_O = W_O * out_norm[:, None, None, :]
    if layer_norm:  # every later LayerNorm removes the mean of what a head writes
        W_O = W_O - W_O.mean(dim=-1, keepdim=True)
    folded = []
    if ln1 is not None:
        folded.append("the norm before attention's scale into W_Q, W_K, W_V" +
                      (", which are centred (LayerNorm)" if layer_norm else ""))
    if layer_norm:
        folded.append("W_O centred (every later LayerNorm removes the mean)")
    if out_norm is not None:
        folded.append("the attention-output norm's scale into W_O")
    if q_norm is not None or k_norm is not None:
        folded.append("the query and key norms' scales into W_Q and W_K")
    if not folded:
        folded.append("nothing: the norms come after each residual sum (post-LN)")
    return FoldedHeads(W_Q.flatten(0, 1), W_K, W_V, W_O.flatten(0, 1), torch.as_tensor(kv, device=W_Q.device),
                       tuple(folded))


def _stacked(weights: Sequence[LayerWeights], name: str, dtype: torch.dtype) -> torch.Tensor | None:
    """One field of every layer stacked in ``dtype`` (layer first); None where no layer has it, ones where some lack
    it."""
    present = [getattr(w, name) for w in weights]
    like = next((t for t in present if t is not None), None)
    if like is None:
        return None
    return torch.stack([(torch.ones_like(like) if t is None else t).detach().to(dtype) for t in present])


# -- the fast path ----------------------------------------------------------------------------------
def _r(matrices: torch.Tensor) -> torch.Tensor:
    """R of the thin QR decomposition, so ``||A X||_F = ||R X||_F``.

    Shape: (..., m, d_head) -> (..., d_head, d_head).
    """
    return torch.linalg.qr(matrices, mode="r").R


def _numerators(left: torch.Tensor, dest: torch.Tensor, gram: torch.Tensor | None, members: torch.Tensor | None,
                n_layers: int, n_heads: int) -> torch.Tensor:
    """||left[h1] @ dest-side(h2)||_F^2 for every h1 of an earlier layer than h2; 0 elsewhere.

    Args:
        left: (layer * head, d_head, d_model), a source head's factor.
        dest: (d_model, n_dest * d_head), layer-major: one factor a destination head (``gram`` None), or one a
            key/value head, whose query heads are ``members`` ((layer * kv_head, m) head indices) and bring their own
            (d_head, d_head) Gram matrix ``gram`` ((layer * head, d_head, d_head)).
    Shape: -> (layer * head, layer * head) float64.
    """
    lh, d_head = left.shape[0], left.shape[1]
    out = torch.zeros(lh, lh, dtype=torch.float64, device=left.device)
    per_layer = dest.shape[1] // (n_layers * d_head)  # destination blocks a layer
    if gram is not None:  # each block's member heads' Gram matrices, flattened: (blocks, m, d_head * d_head)
        gram = gram[members].flatten(-2)
    # At most PRODUCT_FLOATS a product: the blocks of destination layers in chunks of whole layers.
    layers_a_chunk = max(1, PRODUCT_FLOATS // (n_heads * d_head * per_layer * d_head))
    for l1 in range(n_layers - 1):
        checkpoint()  # the app's Stop ends the scores here (no partial grid is kept)
        rows = left[l1 * n_heads:(l1 + 1) * n_heads].reshape(n_heads * d_head, -1)  # (head * d_head, d_model)
        h1 = slice(l1 * n_heads, (l1 + 1) * n_heads)
        for l2 in range(l1 + 1, n_layers, layers_a_chunk):
            end = min(n_layers, l2 + layers_a_chunk)
            product = rows @ dest[:, l2 * per_layer * d_head:end * per_layer * d_head]
            product = product.view(n_heads, d_head, -1, d_head)  # (head, d_head, block, d_head): one C per pair
            if gram is None:
                out[h1, l2 * n_heads:end * n_heads] = product.pow(2).sum(dim=(1, 3)).to(torch.float64)
                continue
            # ||C R^T||^2 = <C^T C, R^T R>: C^T C once per key/value head, then each member's Gram matrix.
            ctc = torch.einsum("hagb,hagc->ghbc", product, product).flatten(-2)  # (block, head, d_head * d_head)
            blocks = slice(l2 * per_layer, end * per_layer)
            num = torch.bmm(ctc, gram[blocks].transpose(1, 2))  # (block, head, m)
            out[h1, members[blocks].flatten()] = num.permute(1, 0, 2).reshape(n_heads, -1).to(torch.float64)
    return out


def _members(heads: FoldedHeads) -> torch.Tensor:
    """The query heads (layer-major indices) of every key/value head. Shape: (layer * kv_head, heads a kv head)."""
    kv, n_kv = heads.kv_of_head.cpu(), heads.W_K.shape[1]
    groups = [torch.nonzero(kv == k).flatten() for k in range(n_kv)]
    if len({len(g) for g in groups}) != 1:
        raise ValueError("Composition scores need every key/value head to serve as many query heads.")
    local = torch.stack(groups)  # (kv_head, m)
    offsets = torch.arange(heads.n_layers)[:, None, None] * heads.n_heads
    return (offsets + local[None]).flatten(0, 1).to(heads.W_Q.device)


def _scores(heads: FoldedHeads) -> dict[str, np.ndarray]:
    """The three kinds' grids from the folded weights, by the factors of the module's docstring ("Speed").

    Shape: -> kind -> (layer * head, layer * head) float64, NaN where the pair cannot compose.
    """
    L, H = heads.n_layers, heads.n_heads
    kv = heads.head_kv()  # (L * H,) index into the flattened key/value heads
    W_K, W_V = heads.W_K.flatten(0, 1), heads.W_V.flatten(0, 1)  # (L * kv, d_model, d_head)
    R_V, R_K = _r(W_V), _r(W_K)  # (L * kv, d_head, d_head)
    left = R_V[kv] @ heads.W_O  # (L * H, d_head, d_model): ||W_OV x|| = ||left x||
    ov_norm = left.flatten(1).norm(dim=1).double()
    q_dest = heads.W_Q @ R_K[kv].transpose(1, 2)  # (L * H, d_model, d_head): ||x W_QK|| = ||x q_dest||
    qk_norm = q_dest.flatten(1).norm(dim=1).double()
    grouped = W_K.shape[0] < heads.W_Q.shape[0]  # grouped-query attention: multiply each key/value head once
    cat = lambda m: m.permute(1, 0, 2).reshape(m.shape[1], -1)  # (n, d_model, d_head) -> (d_model, n * d_head)
    num = {"q": _numerators(left, cat(q_dest), None, None, L, H)}
    if grouped:
        # ||C R^T||^2 = <C^T C, R^T R>: R^T R is W_Q^T W_Q (K) or W_O W_O^T (V), the head's own (d_head, d_head) Gram.
        q_gram = heads.W_Q.transpose(1, 2) @ heads.W_Q
        o_gram = heads.W_O @ heads.W_O.transpose(1, 2)
        members = _members(heads)
        num["k"] = _numerators(left, cat(W_K), q_gram, members, L, H)
        num["v"] = _numerators(left, cat(W_V), o_gram, members, L, H)
    else:
        k_dest = W_K[kv] @ _r(heads.W_Q).transpose(1, 2)  # ||x W_K W_Q^T|| = ||x W_K R_Q^T||
        v_dest = W_V[kv] @ _r(heads.W_O.transpose(1, 2)).transpose(1, 2)  # ||x W_V W_O|| = ||x W_V R_O^T||
        num["k"] = _numerators(left, cat(k_dest), None, None, L, H)
        num["v"] = _numerators(left, cat(v_dest), None, None, L, H)
    layer = torch.arange(L * H, device=left.device) // H
    composes = layer[:, None] < layer[None, :]
    out = {}
    for kind, dest_norm in (("q", qk_norm), ("k", qk_norm), ("v", ov_norm)):
        denominator = ov_norm[:, None] * dest_norm[None, :]
        score = torch.where(denominator > 0, num[kind].clamp_min(0).sqrt() / denominator.clamp_min(1e-300),
                            torch.zeros_like(denominator))
        out[kind] = torch.where(composes, score, torch.full_like(score, float("nan"))).cpu().numpy()
    return out


def random_baseline(d_model: int, d_head: int, *, samples: int = BASELINE_SAMPLES, seed: int = 0,
                    chunk: int = 25) -> tuple[float, float]:
    """The mean and standard deviation of the composition score of random low-rank matrices ``W_A = A_l A_r^T`` and
    ``W_B = B_l B_r^T`` (four (d_model, d_head) matrices of uniform entries, as the tutorial's kaiming_uniform draws:
    the score does not depend on their scale): ``||W_A W_B||_F / (||W_A||_F ||W_B||_F)``. Seeded."""
    gen = torch.Generator().manual_seed(seed)
    scores = []
    gram = lambda m: m.transpose(1, 2) @ m  # (n, d_model, d_head) -> (n, d_head, d_head)
    for start in range(0, samples, chunk):
        checkpoint()
        n = min(chunk, samples - start)
        a_l, a_r, b_l, b_r = (torch.rand(n, d_model, d_head, generator=gen, dtype=torch.float64) * 2 - 1
                              for _ in range(4))
        # Through (d_head, d_head) Gram matrices G: ||A_l M B_r^T||^2 = <G(A_l) M, M G(B_r)> with M = A_r^T B_l,
        # and ||A_l A_r^T||^2 = <G(A_l), G(A_r)>.
        g_al, g_ar, g_bl, g_br = gram(a_l), gram(a_r), gram(b_l), gram(b_r)
        inner = a_r.transpose(1, 2) @ b_l  # (n, d_head, d_head)
        num = ((g_al @ inner) * (inner @ g_br)).sum(dim=(1, 2))
        den = (g_al * g_ar).sum(dim=(1, 2)) * (g_bl * g_br).sum(dim=(1, 2))
        scores.append((num / den).sqrt())
    values = torch.cat(scores)
    return float(values.mean()), float(values.std())


def composition_scores(model: Any, *, seed: int = 0, samples: int = BASELINE_SAMPLES,
                       dtype: torch.dtype = torch.float32) -> CompositionScores:
    """Q-, K- and V-composition of every pair of heads of a model, from its weights, with the random baseline.

    Args:
        model: a loaded model of any family (its weights are read with ``layer_weights``), or its
            ``list[LayerWeights]``.
        seed: the baseline's random matrices.
        samples: how many random pairs the baseline averages.
        dtype: the precision of the folding and the matrix products (float32: within about 1e-5 of a float64
            reference).

    Raises:
        ValueError: the model's layers differ in shape, or it has one layer (no pair composes) — the message says so.
    """
    weights = model if isinstance(model, (list, tuple)) else layer_weights(model)
    if len(weights) < 2:
        raise ValueError("Composition needs two layers at least: a head composes only with heads of later layers.")
    heads = fold_heads(weights, dtype)
    with torch.no_grad():
        grids = _scores(heads)
    d_model, d_head = weights[0].d_model, weights[0].d_head
    # Every kind pairs a (d_model, d_head) x (d_head, d_model) product with another of the same shapes, so one
    # draw of random matrices is the baseline of all three.
    mean, std = random_baseline(d_model, d_head, samples=samples, seed=seed)
    return CompositionScores(grids["q"], grids["k"], grids["v"], dict.fromkeys(KINDS, mean), len(weights),
                             weights[0].n_heads, dict.fromkeys(KINDS, std), heads.folded)


def composition_for_request(request: Any, *, device: str | None = None, seed: int = 0,
                            models: Any = None) -> CompositionScores:
    """Composition scores of the model a ``TraceRequest`` names (its text is not read); ``models``: where the model
    comes from (``model_core.trace.request.Models``; the app passes its cached ones).

    Raises:
        ModelLoadError: the model cannot be loaded.
        ValueError: as ``composition_scores``.
    """
    return composition_scores(resolve(request, device=device, models=models).model, seed=seed)
