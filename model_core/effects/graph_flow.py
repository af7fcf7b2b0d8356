"""Per-node contributions of one input, computed on demand and kept: what the graph walk and every-node views read.

A node is a residual-stream vector: resid_mid (after attention) or resid_post (after the MLP) of a layer at a
position. A node's contributions cost ``n · H · d`` (its attention row's terms); they are kept once computed (a few
kilobytes a node), so a threshold change only re-runs the walk. Nothing of size layer × head × n² × d is held: a
layer's term directions (d × head × n) are made when a batch of its nodes is computed, and dropped after.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.effects.blocks import BlockMap
from model_core.effects.contributions import (
    LayerContributions,
    attention_shares,
    shares,
)

ROW_CHUNK = 64
"""Query rows computed at once when every node of a layer is asked for (a progress step)."""

Progress = Callable[[float], None]
"""Called with the fraction done."""


@dataclass(frozen=True, eq=False)
class NodeContributions:
    """One position's contributions at one layer, no threshold applied.

    Shape: heads (head, key): each (head, key) term's share of resid_mid (keys up to the position for a decoder).
    """

    heads: np.ndarray
    attention_residual: float
    ffn: float
    ffn_residual: float


@dataclass(frozen=True, eq=False)
class BlockVectors:
    """A layer's residual stream and block outputs at some rows. Shape: each (rows, d_model)."""

    resid_pre: torch.Tensor
    attention_out: torch.Tensor  # what the attention block added (resid_mid − resid_pre before a post-LN)
    resid_mid: torch.Tensor
    mlp_out: torch.Tensor
    resid_post: torch.Tensor


class ContributionFlow:
    """The contributions of every node of one input, computed on demand and kept.

    Args:
        source: a ``TraceSource`` or ``CompactSource`` (``model_core.effects.graph_source``).
        blocks: the model's ``BlockMap``.
    """

    def __init__(self, source: Any, blocks: BlockMap) -> None:
        self.source, self.blocks = source, blocks
        self.n_layers, self.n_heads, self.n_tokens = source.n_layers, source.n_heads, source.n_tokens
        self.tokens = source.tokens
        self._mlp: dict[tuple[int, int], tuple[float, float]] = {}
        self._attention: dict[tuple[int, int], tuple[np.ndarray, float]] = {}
        self._lock = threading.Lock()  # one cached flow may serve several sessions

    @property
    def nbytes(self) -> int:
        """Bytes this flow holds of its own: the kept nodes, and a compact pass's residual stream."""
        kept = sum(heads.nbytes for heads, _ in list(self._attention.values()))
        return kept + int(getattr(self.source, "own_nbytes", 0))

    # -- per node ----------------------------------------------------------------------------
    def mlp(self, layer: int, positions: list[int]) -> list[tuple[float, float]]:
        """The MLP block's (ffn, residual) shares at each position, computed where not kept."""
        with self._lock:  # a reached resid_post nearly always reaches its resid_mid: both blocks are filled at once
            self._fill(layer, [p for p in positions if (layer, p) not in self._mlp])
            return [self._mlp[layer, p] for p in positions]

    def attention(self, layer: int, positions: list[int]) -> list[tuple[np.ndarray, float]]:
        """The attention block's ((head, key) shares, residual share) at each position, computed where not kept."""
        with self._lock:
            self._fill(layer, [p for p in positions if (layer, p) not in self._attention])
            return [self._attention[layer, p] for p in positions]

    def node(self, layer: int, position: int) -> NodeContributions:
        """Both blocks' contributions at one node."""
        (heads, res), = self.attention(layer, [position])
        (ffn, ffn_res), = self.mlp(layer, [position])
        return NodeContributions(heads, res, ffn, ffn_res)

    @torch.no_grad()
    def _fill(self, layer: int, positions: list[int]) -> None:
        if not positions:
            return
        pos = np.asarray(sorted(positions), dtype=np.int64)
        n_keys = int(pos.max()) + 1 if self.source.causal else self.n_tokens
        values = self.source.values(layer)[:, :n_keys]
        rows = self.source.rows(layer, pos, n_keys)  # (rows, head, key)
        join, mlp = self._joins(layer, pos, rows, values)
        mlp_shares = shares(torch.stack([mlp.mlp, mlp.residual]), mlp.whole).numpy()  # (2, rows)
        for i, p in enumerate(pos.tolist()):
            self._mlp[layer, p] = (float(mlp_shares[0, i]), float(mlp_shares[1, i]))
        directions = join.directions(self.blocks.raw_directions(layer, values))  # (head, d, key)
        terms, res = attention_shares(rows * join.scale[:, None, None], directions, join.whole, join.residual)
        for i, p in enumerate(pos.tolist()):
            keep = p + 1 if self.source.causal else n_keys
            self._attention[layer, p] = (terms[i, :, :keep].numpy().copy(), float(res[i]))

    def _joins(self, layer: int, pos: np.ndarray, rows: torch.Tensor, values: torch.Tensor):
        z = torch.einsum("rhk,hkd->rhd", rows, values.float())  # each head's output at the rows
        resid_pre = self.source.hidden[layer][pos].float()
        join = self.blocks.attention(layer, z, resid_pre)
        return join, self.blocks.mlp(layer, join.whole, self.source.hidden[layer + 1][pos].float())

    # -- what the pages read besides --------------------------------------------------------
    @torch.no_grad()
    def vectors(self, layer: int, positions: list[int]) -> BlockVectors:
        """The layer's residual stream and block outputs at some positions (the tokens a block promotes)."""
        pos = np.asarray(positions, dtype=np.int64)
        n_keys = int(pos.max()) + 1 if self.source.causal else self.n_tokens
        values = self.source.values(layer)[:, :n_keys]
        join, mlp = self._joins(layer, pos, self.source.rows(layer, pos, n_keys), values)
        resid_pre = self.source.hidden[layer][pos].float()
        return BlockVectors(resid_pre, join.whole - resid_pre, join.whole, mlp.whole - join.whole, mlp.whole)

    def weights(self, layer: int, positions: list[int]) -> np.ndarray:
        """The attention weights of some query rows over every key. Shape: (rows, head, key)."""
        return self.source.rows(layer, np.asarray(positions, dtype=np.int64), self.n_tokens).numpy()

    @torch.no_grad()
    def layer(self, layer: int, progress: Progress | None = None) -> LayerContributions:
        """Every node's contributions in one layer, ``ROW_CHUNK`` query rows at a time (nothing kept).

        Shape: see ``LayerContributions``: attention_heads (q_pos, k_pos, head).
        """
        n, causal = self.n_tokens, self.source.causal
        heads = np.zeros((n, n, self.n_heads), dtype=np.float32)
        res, ffn, ffn_res = (np.zeros(n, dtype=np.float32) for _ in range(3))
        values = self.source.values(layer)
        raw = self.blocks.raw_directions(layer, values)  # (head, d, key), once per layer
        for r0 in range(0, n, ROW_CHUNK):
            pos = np.arange(r0, min(n, r0 + ROW_CHUNK))
            n_keys = int(pos[-1]) + 1 if causal else n
            rows = self.source.rows(layer, pos, n_keys)
            join, mlp = self._joins(layer, pos, rows, values[:, :n_keys])
            terms, r = attention_shares(rows * join.scale[:, None, None],
                                        join.directions(raw[:, :, :n_keys]), join.whole, join.residual)
            heads[pos, :n_keys] = terms.permute(0, 2, 1).numpy()
            res[pos] = r.numpy()
            s = shares(torch.stack([mlp.mlp, mlp.residual]), mlp.whole).numpy()
            ffn[pos], ffn_res[pos] = s[0], s[1]
            if progress is not None:
                progress(min(1.0, (r0 + len(pos)) / n))
        return LayerContributions(layer, heads, res, ffn, ffn_res)

    def every_layer(self, progress: Progress | None = None) -> list[LayerContributions]:
        """Every node's contributions in every layer (n × n × head floats a layer), with progress over them all."""
        out = []
        for layer in range(self.n_layers):
            step = None if progress is None else (lambda f, la=layer: progress((la + f) / self.n_layers))
            out.append(self.layer(layer, step))
        return out
