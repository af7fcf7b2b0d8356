"""Per-node contributions of one input, computed on demand and kept: what the graph walk and every-node views read.

A node is a residual-stream vector: resid_mid (after attention) or resid_post (after the MLP) of a layer at a
position. A node's contributions cost ``n · H · d`` (its attention row's terms); they are kept once computed (a few
kilobytes a node), so a threshold change only re-runs the walk. The kept attention rows are a least-recently-used
cache bounded by ``MAX_KEPT_BYTES`` (an evicted node is computed again when asked); the MLP shares are one fixed
array of two floats a node. Nothing of size layer × head × n² × d is held: a layer's term directions (d × head × n) are made when a chunk
of its nodes is computed, and dropped after.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
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
from model_core.trace.forward import to_host

ROW_CHUNK = 64
"""Query rows computed at once when every node of a layer is asked for (a progress step)."""

FILL_CHUNK = 64
"""Nodes computed under one hold of the flow's lock: a background prefetch never blocks a page's walk for longer."""
MAX_KEPT_BYTES = 64 * 2**20
"""At most this many bytes of kept attention rows (64 MiB: about 4,600 nodes of SmolLM2 at 400 tokens, a quarter
of the app's default derived-results budget); the least recently used are dropped past it and computed again when
asked. ``ContributionFlow.nbytes`` reports this bound, so a cache that measures the flow once accounts for it."""

Progress = Callable[[float], None]
"""Called with the fraction done."""
Stop = Callable[[], bool]
"""Asked between chunks: True stops the work (``Superseded`` is raised)."""


class Superseded(Exception):
    """A computation was stopped because a newer request replaced it (a background prefetch)."""


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
        max_kept_bytes: the bound on the kept attention rows (least recently used dropped past it).
    """

    def __init__(self, source: Any, blocks: BlockMap, max_kept_bytes: int = MAX_KEPT_BYTES) -> None:
        self.source, self.blocks = source, blocks
        self.n_layers, self.n_heads, self.n_tokens = source.n_layers, source.n_heads, source.n_tokens
        self.tokens = source.tokens
        self.max_kept_bytes = int(max_kept_bytes)
        # (ffn, residual) shares of every node, NaN until computed: a fixed layers × tokens × 2 floats
        self._mlp = np.full((self.n_layers, self.n_tokens, 2), np.nan, dtype=np.float32)
        self._attention: OrderedDict[tuple[int, int], tuple[np.ndarray, float]] = OrderedDict()
        self._kept_bytes = 0
        self._lock = threading.Lock()  # one cached flow may serve several sessions

    @property
    def nbytes(self) -> int:
        """Bytes this flow holds of its own: at most ``max_kept_bytes`` of kept attention rows, the MLP shares, and
        a compact pass's residual stream (so a cache that measures it once still sees its bound)."""
        return self.max_kept_bytes + self._mlp.nbytes + int(getattr(self.source, "own_nbytes", 0))

    @property
    def kept_bytes(self) -> int:
        """Bytes of attention rows kept now (at most ``max_kept_bytes``)."""
        return self._kept_bytes

    # -- per node ----------------------------------------------------------------------------
    def mlp(self, layer: int, positions: list[int], stop: Stop | None = None) -> list[tuple[float, float]]:
        """The MLP block's (ffn, residual) shares at each position, computed where not kept.

        Raises:
            Superseded: ``stop`` said so between chunks.
        """
        # a reached resid_post nearly always reaches its resid_mid: both blocks are filled at once
        missing = [p for p in positions if np.isnan(self._mlp[layer, p, 0])]
        for c0 in range(0, len(missing), FILL_CHUNK):  # the lock is held one chunk at a time
            if stop is not None and stop():
                raise Superseded("a newer request replaced this one")
            with self._lock:
                self._fill(layer, [p for p in missing[c0:c0 + FILL_CHUNK] if np.isnan(self._mlp[layer, p, 0])])
                self._evict()
        return [(float(self._mlp[layer, p, 0]), float(self._mlp[layer, p, 1])) for p in positions]

    def attention(self, layer: int, positions: list[int], stop: Stop | None = None) -> list[tuple[np.ndarray, float]]:
        """The attention block's ((head, key) shares, residual share) at each position, computed where not kept.

        Raises:
            Superseded: ``stop`` said so between chunks.
        """
        out: dict[int, tuple[np.ndarray, float]] = {}
        for c0 in range(0, len(positions), FILL_CHUNK):  # the lock is held one chunk at a time
            if stop is not None and stop():
                raise Superseded("a newer request replaced this one")
            chunk = positions[c0:c0 + FILL_CHUNK]
            with self._lock:
                self._fill(layer, [p for p in chunk if (layer, p) not in self._attention])
                for p in chunk:
                    self._attention.move_to_end((layer, p))
                    out[p] = self._attention[layer, p]
                self._evict()
        return [out[p] for p in positions]

    def _evict(self) -> None:
        """Drop the least recently used attention rows past ``max_kept_bytes`` (the lock held)."""
        while self._kept_bytes > self.max_kept_bytes and len(self._attention) > 1:
            _, (heads, _) = self._attention.popitem(last=False)
            self._kept_bytes -= heads.nbytes

    def node(self, layer: int, position: int) -> NodeContributions:
        """Both blocks' contributions at one node."""
        (heads, res), = self.attention(layer, [position])
        (ffn, ffn_res), = self.mlp(layer, [position])
        return NodeContributions(heads, res, ffn, ffn_res)

    @torch.no_grad()
    def _fill(self, layer: int, positions: list[int]) -> None:
        """Compute and keep some positions' contributions in one layer: on the model's device, one copy to the host
        of the chunk's shares."""
        if not positions:
            return
        pos = np.asarray(sorted(positions), dtype=np.int64)
        n_keys = int(pos.max()) + 1 if self.source.causal else self.n_tokens
        values = self.source.values(layer)[:, :n_keys]
        rows = self.source.rows(layer, pos, n_keys)  # (rows, head, key)
        join, mlp = self._joins(layer, pos, rows, values)
        directions = join.directions(self.blocks.raw_directions(layer, values))  # (head, d, key)
        terms, res = attention_shares(rows * join.scale[:, None, None], directions, join.whole, join.residual)
        mlp_shares = shares(torch.stack([mlp.mlp, mlp.residual]), mlp.whole)  # (2, rows)
        terms, res, mlp_shares = to_host([terms, res, mlp_shares])
        self._mlp[layer, pos] = mlp_shares.T
        for i, p in enumerate(pos.tolist()):
            keep = p + 1 if self.source.causal else n_keys
            old = self._attention.pop((layer, p), None)
            self._kept_bytes -= 0 if old is None else old[0].nbytes
            heads = terms[i, :, :keep].copy()
            self._attention[layer, p] = (heads, float(res[i]))
            self._kept_bytes += heads.nbytes

    def _joins(self, layer: int, pos: np.ndarray, rows: torch.Tensor, values: torch.Tensor):
        z = torch.einsum("rhk,hkd->rhd", rows, values.float())  # each head's output at the rows
        join = self.blocks.attention(layer, z, self.source.resid(layer, pos).float())
        return join, self.blocks.mlp(layer, join.whole, self.source.resid(layer + 1, pos).float())

    # -- what the pages read besides --------------------------------------------------------
    @torch.no_grad()
    def joins(self, layer: int, positions: list[int] | np.ndarray) -> tuple[Any, Any]:
        """The attention block's and the MLP block's joins at some query positions: each block's output as its
        parts (``scale``, ``residual``, ``rest``, ``whole``), which every contribution is a share of; the
        attention's read over the keys up to the last position (causal) or all of them."""
        pos = np.asarray(positions, dtype=np.int64)
        n_keys = int(pos.max()) + 1 if self.source.causal else self.n_tokens
        return self._joins(layer, pos, self.source.rows(layer, pos, n_keys), self.source.values(layer)[:, :n_keys])

    @torch.no_grad()
    def vectors(self, layer: int, positions: list[int]) -> BlockVectors:
        """The layer's residual stream and block outputs at some positions (the tokens a block promotes), on the
        model's device."""
        pos = np.asarray(positions, dtype=np.int64)
        join, mlp = self.joins(layer, pos)
        resid_pre = self.source.resid(layer, pos).float()
        return BlockVectors(resid_pre, join.whole - resid_pre, join.whole, mlp.whole - join.whole, mlp.whole)

    def weights(self, layer: int, positions: list[int]) -> np.ndarray:
        """The attention weights of some query rows over every key. Shape: (rows, head, key)."""
        return to_host([self.source.rows(layer, np.asarray(positions, dtype=np.int64), self.n_tokens)])[0]

    @torch.no_grad()
    def layer(self, layer: int, progress: Progress | None = None) -> LayerContributions:
        """Every node's contributions in one layer, ``ROW_CHUNK`` query rows at a time (nothing kept), on the model's
        device, with one copy to the host at the end.

        Shape: see ``LayerContributions``: attention_heads (q_pos, k_pos, head).
        """
        n, causal, device = self.n_tokens, self.source.causal, self.blocks.device
        heads = torch.zeros((n, n, self.n_heads), dtype=torch.float32, device=device)
        res, ffn, ffn_res = (torch.zeros(n, dtype=torch.float32, device=device) for _ in range(3))
        values = self.source.values(layer)
        raw = self.blocks.raw_directions(layer, values)  # (head, d, key), once per layer
        for r0 in range(0, n, ROW_CHUNK):
            pos = np.arange(r0, min(n, r0 + ROW_CHUNK))
            r1, n_keys = r0 + len(pos), int(pos[-1]) + 1 if causal else n
            rows = self.source.rows(layer, pos, n_keys)
            join, mlp = self._joins(layer, pos, rows, values[:, :n_keys])
            terms, r = attention_shares(rows * join.scale[:, None, None],
                                        join.directions(raw[:, :, :n_keys]), join.whole, join.residual)
            heads[r0:r1, :n_keys] = terms.permute(0, 2, 1)
            res[r0:r1] = r
            ffn[r0:r1], ffn_res[r0:r1] = shares(torch.stack([mlp.mlp, mlp.residual]), mlp.whole)
            if progress is not None:
                progress(min(1.0, r1 / n))
        return LayerContributions(layer, *to_host([heads, res, ffn, ffn_res]))

    def every_layer(self, progress: Progress | None = None) -> list[LayerContributions]:
        """Every node's contributions in every layer (n × n × head floats a layer), with progress over them all."""
        out = []
        for layer in range(self.n_layers):
            step = None if progress is None else (lambda f, la=layer: progress((la + f) / self.n_layers))
            out.append(self.layer(layer, step))
        return out
