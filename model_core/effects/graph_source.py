"""Where the contribution graph reads a layer's attention rows, values and residual stream: a full trace, or a long
input's compact trace plus one pass that keeps the residual stream.

A full trace (``AttentionTrace``) already holds every weight, each query head's values and the residual stream. A
compact trace (``CompactTrace``) holds queries, keys and each row's log-sum-exp, so any attention row is exact on
demand; its values and residual stream come from one more compact pass through the route
(``Family.forward(compact=True, hidden=True)``), the values recomputed from each block's input
(``BlockMap.values``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from model_core.effects.blocks import BlockMap
from model_core.effects.graph_flow import ContributionFlow
from model_core.gate import GATE
from model_core.kernel import apply_mask, attention_scores, expand_kv, on_device, weights_from_scores
from model_core.models.run_memory import device_of


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A read-only numpy array as a tensor sharing its memory (never written: the graph only reads it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "not writable": nothing here writes
        return torch.from_numpy(np.asarray(array))


class _HostSource:
    """What both sources share: the residual stream kept on the host (``hidden``), and one layer's values kept on the
    model's device (the last asked for: the walk reads a layer at a time)."""

    hidden: torch.Tensor  # (layer + 1, pos, d_model), on the host
    device: torch.device
    _values: tuple[int, torch.Tensor] | None = None

    def resid(self, stage: int, positions: np.ndarray) -> torch.Tensor:
        """The residual stream entering layer ``stage`` (``n_layers``: after the last) at some positions, on the
        model's device. Shape: -> (rows, d_model)."""
        rows = self.hidden[stage][torch.from_numpy(np.asarray(positions, dtype=np.int64))]
        return on_device(rows, self.device)

    def values(self, layer: int) -> torch.Tensor:
        """Each query head's values at layer ``layer``, on the model's device. Shape: -> (head, pos, d_head)."""
        kept = self._values  # read once: a background prefetch may replace it meanwhile
        if kept is None or kept[0] != layer:
            kept = (layer, self._layer_values(layer))
            self._values = kept
        return kept[1]

    def _layer_values(self, layer: int) -> torch.Tensor:
        raise NotImplementedError


class TraceSource(_HostSource):
    """A full trace's numbers, as the graph reads them: kept on the host, each read moved to the model's device.

    Args:
        trace: the ``AttentionTrace``.
        blocks: the model's ``BlockMap``.
    """

    def __init__(self, trace: Any, blocks: BlockMap) -> None:
        self.trace, self.blocks, self.device = trace, blocks, blocks.device
        self.tokens = tuple(trace.tokens)
        self.n_layers, self.n_heads, self.n_tokens = trace.n_layers, trace.n_heads, trace.n_tokens
        self.causal = bool(trace.causal)
        self.hidden = _tensor(trace.hidden_states)

    def rows(self, layer: int, positions: np.ndarray, n_keys: int) -> torch.Tensor:
        """The attention weights of some query rows over keys ``[0, n_keys)``, on the model's device.

        Shape: -> (rows, head, key).
        """
        w = self.trace.weights[layer][:, positions, :n_keys]  # (head, rows, key)
        return on_device(torch.from_numpy(np.ascontiguousarray(w.transpose(1, 0, 2))), self.device)

    def _layer_values(self, layer: int) -> torch.Tensor:
        return on_device(_tensor(self.trace.values[layer]), self.device)


class CompactSource(_HostSource):
    """A compact trace's exact rows, with values and residual stream from one compact pass. The trace and the
    residual stream stay on the host; each read is computed on the model's device.

    Args:
        compact: the ``CompactTrace``.
        blocks: the model's ``BlockMap``.
        hidden: the residual stream of the compact pass, on the host. Shape: (layer + 1, pos, d_model).
    """

    def __init__(self, compact: Any, blocks: BlockMap, hidden: torch.Tensor) -> None:
        self.compact, self.blocks, self.hidden, self.device = compact, blocks, hidden, blocks.device
        self.tokens = tuple(compact.tokens)
        self.n_layers, self.n_heads, self.n_tokens = compact.n_layers, compact.n_heads, compact.n_tokens
        self.causal = bool(compact.causal)
        self.own_nbytes = hidden.numel() * hidden.element_size()
        # the exact rows are float64 sums: on a device without float64 (Apple's MPS) they are made on the host
        self._exact = self.device if self.device.type != "mps" else torch.device("cpu")
        self._kv_heads = torch.as_tensor(np.asarray(compact.kv_heads), device=self._exact)

    def rows(self, layer: int, positions: np.ndarray, n_keys: int) -> torch.Tensor:
        """Exact attention weights ``exp(score − lse)`` of some query rows over keys ``[0, n_keys)``, 0 where masked,
        on the model's device.

        Shape: -> (rows, head, key).
        """
        ct, at = self.compact, self._exact
        q = on_device(_tensor(ct.queries[layer][:, positions]), at)  # (head, rows, d_head)
        k = expand_kv(on_device(_tensor(ct.keys[layer][:, :n_keys]), at), self._kv_heads)
        scores = attention_scores(q, k, scale=ct.score_scale, softcap=ct.score_softcap)  # (head, rows, key)
        mask = ct.masks[ct.mask_of_layer[layer]]
        allowed = on_device(_tensor(np.ascontiguousarray(mask[positions, :n_keys])), at)
        lse = on_device(_tensor(ct.lse[layer][:, positions]), at)  # (head, rows) float64
        # masked scores first: a masked key's score may be huge (exp -> inf, and inf * 0 is NaN)
        masked = apply_mask(scores.double(), allowed, inplace=True)
        weights = weights_from_scores(masked, lse, inplace=True).float()
        return on_device(weights.transpose(0, 1).contiguous(), self.device)

    def _layer_values(self, layer: int) -> torch.Tensor:
        """Recomputed from the block's input (a compact pass keeps no values)."""
        return self.blocks.values(layer, on_device(self.hidden[layer], self.device))


@torch.inference_mode()
def residual_pass(compact: Any, model: Any, family: Any,
                  on_layer: Callable[[int], None] | None = None) -> torch.Tensor:
    """The residual stream of a compact trace's text: one compact pass through the route (sdpa, no weights kept),
    under a turn of its gate until the tensors are on the CPU.

    Shape: -> (layer + 1, pos, d_model) float32.
    """
    device = device_of(model)
    ids = on_device(torch.as_tensor(np.asarray(compact.token_ids), dtype=torch.long)[None], device)
    with GATE.turn():
        out = family.forward(model, ids, torch.zeros_like(ids), None, compact=True, vectors=False, hidden=True,
                             on_layer=on_layer)
        out.queries.clear()
        out.keys.clear()
        return torch.stack([h[0].detach().to("cpu", torch.float32) for h in out.hidden])


def trace_flow(trace: Any, model: Any, family: Any):
    """The ``ContributionFlow`` of a full trace of ``model`` (of ``family``)."""
    blocks = BlockMap(family, model)
    return ContributionFlow(TraceSource(trace, blocks), blocks)


def compact_flow(compact: Any, model: Any, family: Any, on_layer: Callable[[int], None] | None = None):
    """The ``ContributionFlow`` of a compact trace of ``model``: runs one compact pass for the residual stream."""
    blocks = BlockMap(family, model)
    return ContributionFlow(CompactSource(compact, blocks, residual_pass(compact, model, family, on_layer)), blocks)
