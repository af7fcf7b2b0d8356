"""Where a compression policy reads the prefill's attention (``model_core.generate.presses.AttentionSource``).

Under a causal mask the prefill (every token but the last) attends exactly as the first n − 1 rows of the whole
text do, so its weights come from any of:

- ``QKSource``: queries and keys, each block of rows softmaxed when asked (the prefill pass's own recordings, or a
  compact trace's arrays: ``compact_source``); memory grows with the length, not its square;
- ``TraceSource``: a full trace's stored weights.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from model_core.compact.trace import CompactTrace
from model_core.kernel import apply_mask, attention_scores, causal_allowed, expand_kv, weights_from_scores
from model_core.trace.shape import LayerHeadGrid
from model_core.trace.trace import AttentionTrace


def _check_decoder(is_decoder: bool, n_tokens: int) -> int:
    """The prefill's length for a trace of ``n_tokens``.

    Raises:
        ValueError: the model is not a decoder (an encoder has no KV cache) or the text is too short.
    """
    if not is_decoder:
        raise ValueError("An encoder has no KV cache: every token attends to every other at once and nothing is "
                         "generated. Pick a decoder such as SmolLM2-135M-Instruct.")
    if n_tokens < 3:
        raise ValueError(f"The text has {n_tokens} token(s); compressing a cache needs at least 3 (two to prefill, "
                         "one to predict from). Type a longer text.")
    return n_tokens - 1


@dataclass(frozen=True, eq=False)
class QKSource(LayerHeadGrid):
    """The prefill's attention computed from queries and keys, a block of rows at a time.

    Attributes:
        queries: layer tensors of (head, pos, d_head), after the rotary embedding (``pos`` ≥ n_prefill: rows past
            the prefill are never read).
        key_states: layer tensors of (kv_head, pos, d_head).
        kv_heads: Shape: (head,) int64.
        scales, softcaps: each layer's score scaling and softcap (Gemma 2), or None.
        allowed: each layer's mask, True where a query may see a key, as a function of the layer (None: causal).
        n_prefill: the prefill's length.
        lse: each layer's row log-sum-exps (a compact trace's), as a function of the layer, or None: a weight is then
            ``exp(score - lse)``, one pass over a block instead of a softmax's three. Shape: -> (head, pos).
    """

    queries: Sequence[torch.Tensor]
    key_states: Sequence[torch.Tensor]
    kv_heads: np.ndarray
    scales: Sequence[float]
    softcaps: Sequence[float | None]
    n_prefill: int
    allowed: Callable[[int], torch.Tensor | None] = lambda layer: None
    lse: Callable[[int], torch.Tensor] | None = None

    @property
    def grid_shape(self) -> tuple[int, int]:
        return len(self.queries), len(self.kv_heads)

    def _weights(self, layer: int, r0: int, r1: int, c1: int) -> torch.Tensor:
        """The softmax of rows r0:r1 over keys 0:c1, in float32 as the model computes it. Shape: (head, rows, c1)."""
        q = self.queries[layer][:, r0:r1].float()  # (head, rows, d_head)
        k = expand_kv(self.key_states[layer][:, :c1].float(), self.kv_heads)
        scores = attention_scores(q, k, scale=self.scales[layer], softcap=self.softcaps[layer])  # (head, rows, c1)
        seen = causal_allowed(range(r0, r1), range(c1))  # causal, within the prefill
        mask = self.allowed(layer)
        if mask is not None:
            seen = seen & mask[r0:r1, :c1]
        return weights_from_scores(apply_mask(scores, seen, inplace=True))

    def rows(self, layer: int, r0: int, r1: int, c1: int | None = None) -> np.ndarray:
        """Shape: -> (head, r1 - r0, c1) float64 (see ``AttentionSource.rows``)."""
        return self._weights(layer, r0, r1, self.n_prefill if c1 is None else c1).double().numpy()

    def column_sums(self, layer: int, block: int) -> np.ndarray:
        """Each prefill key's weight summed over every prefill query, ``block`` rows at a time: a block sees no key
        past its last row, and only its diagonal tile needs the causal mask. Shape: -> (head, n_prefill) float64."""
        n, cap, scale = self.n_prefill, self.softcaps[layer], self.scales[layer]
        q = self.queries[layer][:, :n].float()
        k = expand_kv(self.key_states[layer][:, :n].float(), self.kv_heads)
        lse = None if self.lse is None else self.lse(layer)[:, :n].float()
        mask = self.allowed(layer)
        sums = torch.zeros(self.n_heads, n, dtype=torch.float64)
        for r0 in range(0, n, block):
            r1 = min(n, r0 + block)
            scores = attention_scores(q[:, r0:r1], k[:, :r1], scale=scale, softcap=cap)  # (head, rows, r1)
            apply_mask(scores[:, :, r0:r1], causal_allowed(range(r0, r1), range(r0, r1)), inplace=True)
            apply_mask(scores, None if mask is None else mask[r0:r1, :r1], inplace=True)
            weights = weights_from_scores(scores, None if lse is None else lse[:, r0:r1], inplace=True)
            sums[:, :r1] += weights.sum(1)
        return sums.numpy()

    def keys(self, layer: int) -> np.ndarray:
        return self.key_states[layer][:, : self.n_prefill].float().numpy()


@dataclass(frozen=True, eq=False)
class TraceSource(LayerHeadGrid):
    """The prefill's attention read from a full trace's weights (rows past the prefill are never read; under a
    causal mask a prefill row puts no weight on the last token)."""

    trace: AttentionTrace

    def __post_init__(self) -> None:
        _check_decoder(self.trace.is_decoder, self.trace.n_tokens)

    @property
    def grid_shape(self) -> tuple[int, int]:
        return self.trace.n_layers, self.trace.n_heads

    @property
    def n_prefill(self) -> int:
        return self.trace.n_tokens - 1

    @property
    def kv_heads(self) -> np.ndarray:
        return np.asarray(self.trace.kv_heads)

    def rows(self, layer: int, r0: int, r1: int, c1: int | None = None) -> np.ndarray:
        c1 = self.n_prefill if c1 is None else c1
        return self.trace.weights[layer, :, r0:r1, :c1].astype(np.float64)

    def column_sums(self, layer: int, block: int) -> np.ndarray:
        n = self.n_prefill
        return self.trace.weights[layer, :, :n, :n].sum(1, dtype=np.float64)

    def keys(self, layer: int) -> np.ndarray:
        first = [int(np.flatnonzero(self.kv_heads == g)[0]) for g in range(int(self.kv_heads.max()) + 1)]
        return self.trace.keys[layer, first, : self.n_prefill]


def _view(array: np.ndarray) -> torch.Tensor:
    """A read-only array as a tensor without a copy (nothing here writes to it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns that the array is not writable
        return torch.from_numpy(array)


def compact_source(trace: CompactTrace) -> QKSource:
    """A compact trace's queries and keys as a source (its masks where they are not plainly causal).

    Raises:
        ValueError: the trace is an encoder's, or too short.
    """
    n_prefill = _check_decoder(trace.is_decoder, trace.n_tokens)
    n_layers = trace.n_layers

    def allowed(layer: int) -> torch.Tensor | None:
        mask = trace.layer_mask(layer)
        return None if mask.causal else mask.allowed

    return QKSource(queries=[_view(trace.queries[la]) for la in range(n_layers)],
                    key_states=[_view(trace.keys[la]) for la in range(n_layers)],
                    kv_heads=np.asarray(trace.kv_heads, dtype=np.int64), scales=[trace.score_scale] * n_layers,
                    softcaps=[trace.score_softcap] * n_layers, n_prefill=n_prefill, allowed=allowed,
                    lse=lambda layer: _view(trace.lse[layer]))


def source_of(trace: AttentionTrace | CompactTrace) -> TraceSource | QKSource:
    """The source a trace of the whole text gives (full or compact).

    Raises:
        ValueError: the trace is an encoder's, too short, or has heads switched off.
    """
    if isinstance(trace, CompactTrace):
        return compact_source(trace)
    if not np.all(trace.head_mask):
        raise ValueError("This trace has heads switched off; a compressed cache is read with every head on. "
                         "Switch the heads back on (Head masking page or the sidebar).")
    return TraceSource(trace)
