"""What the pages draw from a compact trace (``model_core.compact.trace``), each exact and at the cost of what is drawn:
coarser overviews, one head grouped by sentence or line, the share to the first token, and the switch point
between the full and the compact form."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.compact.trace import QUERY_BLOCK, CompactTrace
from model_core.compact.summary import group_shares
from model_core.kernel import apply_mask, attention_scores, expand_kv, weights_from_scores
from model_core.trace.forward import full_trace_bytes
from model_core.words import piece_text, span_text

MAX_GROUPS = 256
"""Most sentence or line groups a grouped view has: past it, neighbouring groups are merged."""
_SENTENCE_END = re.compile(r"[.!?。！？]['\"”’)\]]*$")


@dataclass(frozen=True)
class TraceForm:
    """Which form a request is traced in, and why (for the pages' captions)."""

    compact: bool
    n_tokens: int
    full_bytes: int
    reason: str


def choose_form(n_layers: int, n_heads: int, n_tokens: int, full_trace_mb: int, can_compact: bool) -> TraceForm:
    """The full form where its weights fit ``full_trace_mb`` (AE_FULL_TRACE_MB), the compact form past it."""
    size = full_trace_bytes(n_layers, n_heads, n_tokens)
    if size <= full_trace_mb * 1e6 or not can_compact:
        return TraceForm(False, n_tokens, size, f"full: {n_layers} x {n_heads} x {n_tokens}² weights are "
                                                f"{size / 1e6:,.0f} MB, within AE_FULL_TRACE_MB = {full_trace_mb} MB")
    return TraceForm(True, n_tokens, size, f"compact: a full trace would hold {n_layers} x {n_heads} x {n_tokens}² "
                                           f"weights, {size / 1e9:,.1f} GB, over AE_FULL_TRACE_MB = {full_trace_mb} MB")


def coarser_overview(trace: CompactTrace, cells: int) -> np.ndarray:
    """The overview with at most ``cells`` cells a side, still exact block means: a coarse cell's row is the
    row-count-weighted mean of its fine rows, and its keys the sum of its fine keys.

    Shape: -> (layer, head, m, m), m = ceil(fine / ceil(fine / cells)).
    """
    fine = trace.overview.shape[-1]
    group = math.ceil(fine / cells)
    if group == 1:
        return trace.overview
    n, pool = trace.n_tokens, trace.pool
    counts = np.bincount(np.arange(n) // pool, minlength=fine).astype(np.float64)  # rows in each fine cell
    coarse = np.arange(fine) // group
    m = int(coarse[-1]) + 1
    member = np.zeros((fine, m))
    member[np.arange(fine), coarse] = 1.0  # (fine cell, coarse cell)
    by_key = trace.overview.astype(np.float64) @ member  # keys summed: (layer, head, fine, m)
    out = np.einsum("fc,lhfm->lhcm", member * counts[:, None], by_key)  # rows weighted by their counts
    row_counts = counts @ member
    return (out / row_counts[None, None, :, None]).astype(np.float32)


def segment_starts(tokens: tuple[str, ...], by: str) -> np.ndarray:
    """Where each sentence (``by="sentence"``) or line (``"line"``) starts, as token positions; at most
    ``MAX_GROUPS`` groups (neighbours merged past it). Shape: -> (group,) int64, starting with 0."""
    if by not in ("sentence", "line"):
        raise ValueError(f"Group tokens by 'sentence' or 'line', not {by!r}.")
    starts = [0]
    for i, token in enumerate(tokens[:-1]):
        text = piece_text(token)
        ends = "\n" in text if by == "line" else ("\n" in text or bool(_SENTENCE_END.search(text.strip())))
        if ends:
            # a sentence's closing line break or space belongs to it, not to a group of its own
            nxt = i + 1
            while nxt < len(tokens) - 1 and not piece_text(tokens[nxt]).strip() and by == "sentence":
                nxt += 1
            starts.append(nxt)
    starts = np.unique(np.array(starts, dtype=np.int64))
    if len(starts) > MAX_GROUPS:
        starts = starts[np.linspace(0, len(starts) - 1, MAX_GROUPS).round().astype(int)]
        starts = np.unique(np.concatenate([[0], starts]))
    return starts


def group_means(trace: CompactTrace, layer: int, head: int, starts: np.ndarray) -> np.ndarray:
    """One head's attention between groups of tokens (sentences, lines, or blocks), exact: a cell is the mean over
    the group's queries of the weight they give the other group's keys (so rows sum to 1). Computed in blocks of
    query rows from the queries, keys and lse; nothing n x n is held.

    Shape: starts (group,) -> (group, group).
    """
    trace._check(layer, head)
    n = trace.n_tokens
    starts = np.asarray(starts, dtype=np.int64)
    if len(starts) == 0 or starts[0] != 0 or np.any(np.diff(starts) <= 0) or starts[-1] >= n:
        raise ValueError(f"Group starts must rise from 0 and stay below {n}.")
    group_of = torch.from_numpy(np.searchsorted(starts, np.arange(n), side="right") - 1)
    g = len(starts)
    q = torch.from_numpy(trace.queries[layer, head])
    k = torch.from_numpy(trace.keys[layer, int(trace.kv_heads[head])])
    allowed = torch.from_numpy(trace.masks[trace.mask_of_layer[layer]])
    counts = torch.bincount(group_of, minlength=g).double()
    shares = group_shares(q, k, trace.layer_mask(layer), trace.score_scale, trace.score_softcap, group_of, g)
    if shares is not None:  # one pass of the fused kernel: tens of ms for 4,096 tokens
        return (torch.zeros(g, g, dtype=torch.float64).index_add_(0, group_of, shares) / counts[:, None]).numpy()
    lse = torch.from_numpy(trace.lse[layer, head])
    out = torch.zeros(g, g, dtype=torch.float64)
    for r0 in range(0, n, QUERY_BLOCK):
        r1 = min(r0 + QUERY_BLOCK, n)
        s = attention_scores(q[r0:r1], k, scale=trace.score_scale, softcap=trace.score_softcap)
        masked = apply_mask(s, allowed[r0:r1], inplace=True).double()
        w = weights_from_scores(masked, lse[r0:r1], inplace=True)  # (rows, pos)
        by_key = torch.zeros(r1 - r0, g, dtype=torch.float64).index_add_(1, group_of, w)
        out.index_add_(0, group_of[r0:r1], by_key)
    return (out / counts[:, None]).numpy()


def pooled_head(trace: CompactTrace, layer: int, head: int, cells: int = 64) -> tuple[np.ndarray, int]:
    """One head's exact block means at ``cells`` a side (finer than the stored overview) and the block width.

    Shape: -> (m, m), m = ceil(pos / pool) <= cells.
    """
    pool = math.ceil(trace.n_tokens / cells)
    return group_means(trace, layer, head, np.arange(0, trace.n_tokens, pool)), pool


def first_token_share(trace: CompactTrace, layer: int, head: int) -> np.ndarray:
    """Each query's weight on the first token (the attention sink), exact. Shape: -> (pos,)."""
    return trace.weights(layer, head, cols=slice(0, 1))[:, 0]


def window_without_first(window: np.ndarray, first: np.ndarray, cols: slice) -> np.ndarray:
    """A window's weights renormalised without the first token: each row divided by 1 - its weight on token 0
    (the weight its row gives every other key), token 0's column dropped if the window has it.

    Shape: window (rows, cols); first (rows,) -> (rows, cols or cols - 1).
    """
    rest = np.maximum(1.0 - np.asarray(first, dtype=np.float64), 1e-12)
    out = window / rest[:, None]
    return out[:, 1:] if (cols.start or 0) == 0 else out


def group_labels(tokens: tuple[str, ...], starts: np.ndarray, width: int = 28,
                 byte_level: bool | None = None) -> list[str]:
    """A label per group: its first position and the start of its text (``byte_level``: the trace's, for
    ``span_text``)."""
    ends = [*starts[1:], len(tokens)]
    labels = []
    for i, (a, b) in enumerate(zip(starts, ends)):
        text = span_text(tokens[a:b], byte_level).replace("\n", " ")
        labels.append(f"{i}: [{a}–{b - 1}] {text[:width]}{'…' if len(text) > width else ''}")
    return labels


def describe(trace: CompactTrace) -> dict[str, Any]:
    """The compact trace's size in words, for the page's caption."""
    return {"tokens": trace.n_tokens, "layers": trace.n_layers, "heads": trace.n_heads,
            "held_mb": trace.nbytes() / 1e6,
            "full_gb": full_trace_bytes(trace.n_layers, trace.n_heads, trace.n_tokens) / 1e9}



def rollout_row(trace: CompactTrace, target: int = -1, residual: float = 0.5,
                progress: Any = None) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema 2020) into one token of a long input: e_target · Ã_L-1 ⋯ Ã_0, with
    Ã = r·I + (1 - r)·mean_h(A) as ``analysis.rollout.mixed_attention``. Each layer's head mean is recomputed in
    blocks of query rows from the queries, keys and lse and applied to the vector at once, so no n x n matrix is
    held; ``progress`` is called with the fraction of layers done.

    Shape: -> (pos,) float64, sums to 1.
    """
    n = trace.n_tokens
    target = target + n if target < 0 else target
    if not 0 <= target < n:
        raise ValueError(f"target must be a position from 0 to {n - 1}.")
    v = torch.zeros(n, dtype=torch.float64)
    v[target] = 1.0
    for step, layer in enumerate(reversed(range(trace.n_layers))):
        k_all = expand_kv(trace.keys[layer], trace.kv_heads)
        allowed = torch.from_numpy(trace.masks[trace.mask_of_layer[layer]])
        mixed = torch.zeros(n, dtype=torch.float64)
        for r0 in range(0, n, QUERY_BLOCK):
            r1 = min(r0 + QUERY_BLOCK, n)
            if not bool(v[r0:r1].any()):
                continue  # rows the vector does not reach add nothing
            reach = allowed[r0:r1].any(0).nonzero()  # a causal block reads no key past its last row
            if not len(reach):
                continue
            width = int(reach[-1]) + 1
            q = torch.from_numpy(trace.queries[layer, :, r0:r1])
            s = attention_scores(q, k_all[:, :width], scale=trace.score_scale, softcap=trace.score_softcap)
            apply_mask(s, allowed[r0:r1, :width], inplace=True)  # (head, rows, width)
            # float32 tiles (each weight within 1e-6 of float64's); the products summed in float64
            w = weights_from_scores(s, trace.lse[layer, :, r0:r1], inplace=True).mean(0)  # (rows, width)
            mixed[:width] += (v[r0:r1].float() @ w).double()
        v = residual * v + (1.0 - residual) * mixed
        v /= v.sum()
        if progress is not None:
            progress((step + 1) / trace.n_layers)
    return v.numpy()
