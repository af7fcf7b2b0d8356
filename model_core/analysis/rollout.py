"""Attention rollout and attention flow, after Abnar & Zuidema (2020), "Quantifying Attention Flow in
Transformers" (ACL).

Both model the residual connection by mixing each layer's head-averaged attention with the
identity, Ã = r·I + (1 - r)·A with r = 0.5, rows renormalised. Rollout multiplies the Ã through the
layers; flow treats the layers as a graph whose edge capacities are the Ã entries and takes, for each
(output token, input token), the value of the maximum flow between them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.sparse import csr_array
from scipy.sparse.csgraph import maximum_flow

FLOW_MAX_TOKENS = 48
"""Largest input for the full flow matrix: n² max-flow problems on a graph of n²·layers edges.

Measured with ``bench/bench_analysis.py`` (12 layers, 2 CPU cores): 48 tokens take about 3 s.
"""

FLOW_MAX_TOKENS_ONE_ROW = 160
"""Largest input for the flow into one output token ([CLS], or a decoder's last token): n max-flow problems."""

FLOW_SCALE = 2**20
"""Capacities are scaled to integers for scipy's max-flow; the rounding error per edge is < 1e-6."""


def mixed_attention(attentions: np.ndarray, head_mask: np.ndarray | None = None, residual: float = 0.5) -> np.ndarray:
    """Head-averaged attention with the residual added: r·I + (1 - r)·mean_h(A), rows renormalised.

    Heads switched off in ``head_mask`` are left out of the average (their output is gated to zero);
    a layer with every head off is the identity, the residual alone.

    Shape: attentions (layer, head, q_pos, k_pos), head_mask (layer, head) -> (layer, q_pos, k_pos).
    """
    attentions = np.asarray(attentions)
    if attentions.ndim != 4 or attentions.shape[-1] != attentions.shape[-2]:
        raise ValueError(f"attentions must be (layer, head, q_pos, k_pos), got shape {attentions.shape}.")
    if not 0.0 <= residual <= 1.0:
        raise ValueError(f"residual must be between 0 and 1, got {residual}.")
    n_layers, n_heads, n, _ = attentions.shape
    on = np.ones((n_layers, n_heads), dtype=bool) if head_mask is None else np.asarray(head_mask, dtype=bool)
    if on.shape != (n_layers, n_heads):
        raise ValueError(f"head_mask must be (layer, head) = {(n_layers, n_heads)}, got {on.shape}.")
    weights = on / np.maximum(on.sum(axis=1, keepdims=True), 1)  # (layer, head)
    mixed = np.empty((n_layers, n, n))
    # A layer at a time in float64: a float64 copy of every weight was 0.6 GB (and most of the rollout page's time)
    # at 512 tokens of SmolLM2.
    for layer in range(n_layers):
        if not on[layer].any():
            mixed[layer] = np.eye(n)  # every head off: the residual alone
            continue
        averaged = np.tensordot(weights[layer], np.asarray(attentions[layer], dtype=np.float64), axes=1)
        averaged *= 1.0 - residual
        averaged[np.diag_indices(n)] += residual
        mixed[layer] = averaged / averaged.sum(axis=-1, keepdims=True)
    return mixed


def attention_rollout(
    attentions: np.ndarray, head_mask: np.ndarray | None = None, residual: float = 0.5
) -> np.ndarray:
    """Attention rollout after every layer: R_l = Ã_l · Ã_{l-1} · … · Ã_0.

    Row i of ``R_l`` says how much of token i's representation after layer l comes from each input
    token; every row sums to 1.

    Shape: attentions (layer, head, q_pos, k_pos) -> (layer, q_pos, k_pos).
    """
    mixed = mixed_attention(attentions, head_mask, residual)
    out = np.empty_like(mixed)
    current = np.eye(mixed.shape[-1])
    for layer, a in enumerate(mixed):
        current = a @ current
        out[layer] = current
    return out


def flow_graph(mixed: np.ndarray) -> csr_array:
    """The layered graph of attention flow, capacities scaled to integers.

    Node ``l * n + j`` is token j before layer l (l = 0 are the input embeddings, l = layer the
    output); the edge from node (l, j) to node (l + 1, i) has capacity Ã_l[i, j].

    Shape: mixed (layer, q_pos, k_pos) -> ((layer + 1) · pos, (layer + 1) · pos).
    """
    n_layers, n, _ = mixed.shape
    q, k = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    rows, cols, caps = [], [], []
    for layer in range(n_layers):
        rows.append(layer * n + k.ravel())
        cols.append((layer + 1) * n + q.ravel())
        caps.append(np.rint(mixed[layer].ravel() * FLOW_SCALE).astype(np.int32))
    size = (n_layers + 1) * n
    graph = csr_array(
        (np.concatenate(caps), (np.concatenate(rows), np.concatenate(cols))), shape=(size, size), dtype=np.int32
    )
    graph.eliminate_zeros()
    return graph


def attention_flow(
    attentions: np.ndarray,
    head_mask: np.ndarray | None = None,
    residual: float = 0.5,
    rows: list[int] | None = None,
) -> np.ndarray:
    """Attention flow: the max-flow value from each input token to each output token.

    Raw values, not normalised: a row does not sum to 1. Use ``normalize_rows`` to compare rows.

    Args:
        attentions: the attention weights of every layer and head.
        head_mask: heads to leave out of the average (see ``mixed_attention``).
        residual: weight r of the identity in Ã.
        rows: output tokens (q_pos after the last layer) to compute; None means all. Rows not
            asked for are NaN.

    Raises:
        ValueError: the input is longer than ``FLOW_MAX_TOKENS`` (all rows) or
            ``FLOW_MAX_TOKENS_ONE_ROW`` (a few rows); the message says what to do.

    Shape: attentions (layer, head, q_pos, k_pos) -> (q_pos, k_pos).
    """
    mixed = mixed_attention(attentions, head_mask, residual)
    n_layers, n, _ = mixed.shape
    wanted = list(range(n)) if rows is None else [int(r) for r in rows]
    check_flow_size(n, all_rows=rows is None or len(wanted) > 1)
    if any(not 0 <= r < n for r in wanted):
        raise ValueError(f"rows must be token positions between 0 and {n - 1}, got {wanted}.")
    graph = flow_graph(mixed)
    out = np.full((n, n), np.nan)
    for i in wanted:
        sink = n_layers * n + i
        for j in range(n):
            out[i, j] = maximum_flow(graph, j, sink).flow_value / FLOW_SCALE
    return out


def check_flow_size(n_tokens: int, all_rows: bool = True) -> None:
    """Raise a ValueError if attention flow over ``n_tokens`` would take too long.

    Raises:
        ValueError: with the limit and what to do instead.
    """
    limit = FLOW_MAX_TOKENS if all_rows else FLOW_MAX_TOKENS_ONE_ROW
    if n_tokens > limit:
        what = "the full attention-flow matrix" if all_rows else "attention flow into one token"
        raise ValueError(
            f"{what} is limited to {limit} tokens (this input has {n_tokens}): it solves one max-flow "
            f"problem per token pair. Shorten the text, or use attention rollout, which has no limit."
        )


def normalize_rows(matrix: np.ndarray) -> np.ndarray:
    """Divide every row by its sum (rows summing to 0 or NaN stay as they are).

    Shape: (..., q_pos, k_pos) -> same.
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    sums = matrix.sum(axis=-1, keepdims=True)
    ok = np.isfinite(sums) & (sums > 0)
    return np.where(ok, matrix / np.where(ok, sums, 1.0), matrix)


@dataclass(frozen=True, eq=False)
class RolloutResult:
    """Rollout after every layer and, when affordable, flow.

    Attributes:
        rollout: Shape: (layer, q_pos, k_pos), rows sum to 1.
        flow: raw max-flow values, or None when the input is past the limit. Shape: (q_pos, k_pos).
        target_flow: the flow into output token ``target``, or None when past the one-row limit.
            Shape: (k_pos,).
        target: the output token whose relevance the pages show: 0 ([CLS], what a classifier reads) for an
            encoder, the last token (the one that predicts the next) for a decoder.
    """

    rollout: np.ndarray
    flow: np.ndarray | None
    target_flow: np.ndarray | None
    target: int = 0

    def __post_init__(self) -> None:
        n = self.rollout.shape[-1]
        if not 0 <= self.target < n:
            raise ValueError(f"target must be a token position between 0 and {n - 1}, got {self.target}.")

    @property
    def target_rollout(self) -> np.ndarray:
        """Relevance of each input token to output token ``target`` after the last layer. Shape: (k_pos,)."""
        return self.rollout[-1, self.target]

    @property
    def cls_rollout(self) -> np.ndarray:
        """``target_rollout`` (its name from when the target was always [CLS])."""
        return self.target_rollout

    @property
    def cls_flow(self) -> np.ndarray | None:
        """``target_flow`` (its name from when the target was always [CLS])."""
        return self.target_flow


def rollout_and_flow(
    attentions: np.ndarray, head_mask: np.ndarray | None = None, residual: float = 0.5, target: int = 0
) -> RolloutResult:
    """Rollout, plus flow (full matrix and the ``target`` row) wherever the input is within the limits.

    Args:
        target: the output token whose relevance is wanted: 0 for [CLS], the last position for a decoder
            (``_common.markers(trace).readout``); negative counts from the end.
    """
    n = np.asarray(attentions).shape[-1]
    target = target + n if target < 0 else target
    rollout = attention_rollout(attentions, head_mask, residual)
    flow = attention_flow(attentions, head_mask, residual) if n <= FLOW_MAX_TOKENS else None
    if flow is not None:
        target_flow = flow[target]
    elif n <= FLOW_MAX_TOKENS_ONE_ROW:
        target_flow = attention_flow(attentions, head_mask, residual, rows=[target])[target]
    else:
        target_flow = None
    return RolloutResult(rollout=rollout, flow=flow, target_flow=target_flow, target=target)
