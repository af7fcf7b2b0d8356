"""The second run of head masking, kept lean: the same tokens with some heads switched off, keeping only what the
comparison reads (how much each head's attention moved, the residual stream, and the output at the read-out token).

The baseline is a full trace; the masked run needs no queries, keys, values, value norms or predictions at every
position, and a decoder's vocabulary is unembedded at its last token only. Its attention weights are compared with
the baseline's as soon as the pass ends and then dropped: a run keeps two (layer, head) grids, not a second
(layer, head, n, n) stack (268 MB for SmolLM2 at 510 tokens). It resolves its model as a trace does (``resolve``)
and goes through the one forward route (``Family.forward``) with the same head gate, under one turn of the route's
gate until its arrays are numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model_core.analysis.masking import attention_change
from model_core.families import Family, ForwardOutput
from model_core.settings import Settings
from model_core.trace.forward import head_gate, to_numpy, top_tokens
from model_core.gate import GATE
from model_core.trace.request import TraceRequest
from model_core.trace.resolve import Models, resolve
from model_core.trace.shape import arrays_nbytes, freeze_arrays
from model_core.trace.trace import AttentionTrace
from model_core.walk.encoder import encoded_from_trace

TOP_K = 10


@dataclass(frozen=True, eq=False)
class MaskedRun:
    """What ``compare_masking`` and ``next_token_effect`` read of a run with some heads switched off.

    Attributes:
        tokens: the baseline's tokens.
        head_mask: True where a head was on. Shape: (layer, head) bool.
        attention_tv: total variation ½Σ|p - q| between each head's attention rows here and in the baseline,
            averaged over queries (``masking.attention_change``; switched-off heads not blanked). Shape: (layer, head).
        attention_js: the JS divergence in bits, likewise. Shape: (layer, head).
        hidden_states: the residual stream, embeddings first. Shape: (layer + 1, pos, hidden).
        logits: the custom encoder's classifier logits, or None. Shape: (num_labels,).
        next_token_probs: a decoder's whole next-token distribution at its last token, or None. Shape: (vocab,).
        top_ids: its top ``TOP_K`` tokens, best first, or None. Shape: (k,). top_strings: their text.
    """

    tokens: tuple[str, ...]
    head_mask: np.ndarray
    attention_tv: np.ndarray
    attention_js: np.ndarray
    hidden_states: np.ndarray
    logits: np.ndarray | None = None
    next_token_probs: np.ndarray | None = None
    top_ids: np.ndarray | None = None
    top_strings: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        freeze_arrays(self)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        """Bytes held by the run's arrays."""
        return arrays_nbytes(self)


@torch.no_grad()
def run_masked(request: TraceRequest, baseline: AttentionTrace, head_mask: np.ndarray, *,
               device: str | torch.device | None = None, settings: Settings | None = None,
               models: Models | None = None) -> MaskedRun:
    """Run the request's model on the baseline's tokens with the heads ``head_mask`` switches off.

    Args:
        request: the request ``baseline`` was traced from (its model).
        baseline: the full trace with all heads on; its tokens are reused, not tokenised again.
        head_mask: (layer, head) bools; False switches a head off.

    Raises:
        ValueError: the mask's shape is not the model's (layer, head).
    """
    resolved = resolve(request, device=device, settings=settings, models=models)
    family, model, tokenizer = resolved.family, resolved.model, resolved.tokenizer
    device_ = next(model.parameters()).device
    gate = head_gate(head_mask, family.n_layers(model.config), family.n_heads(model.config), device_)
    encoded = encoded_from_trace(baseline)
    with GATE.turn():  # until the run's arrays are numpy
        out = family.forward(model, encoded.input_ids.to(device_), encoded.token_type_ids.to(device_), None,
                             head_mask=gate, vectors=False)
        return _run_of(family, model, tokenizer, baseline, head_mask, out)


def _run_of(family: Family, model: Any, tokenizer: Any, baseline: AttentionTrace, head_mask: np.ndarray,
            out: ForwardOutput) -> MaskedRun:
    """The pass's tensors, compared with the baseline, as a ``MaskedRun``."""
    tv, js = attention_change(baseline.weights, [w[0] for w in out.weights], baseline.mask)
    hidden = torch.stack([h[0] for h in out.hidden])  # (layer + 1, pos, hidden)
    extra: dict = {}
    if family.is_decoder:
        logits = family.unembed(model, hidden[-1, -1:])[0]  # the last token's: (vocab,)
        probs = torch.softmax(logits.double(), dim=-1)
        ids, _, strings = top_tokens(probs, TOP_K, tokenizer)
        extra = {"next_token_probs": probs.cpu().numpy(), "top_ids": ids, "top_strings": strings}
    return MaskedRun(
        tokens=baseline.tokens,
        head_mask=np.asarray(head_mask, dtype=bool),
        attention_tv=tv,
        attention_js=js,
        hidden_states=to_numpy(hidden),
        logits=None if out.class_logits is None else to_numpy(out.class_logits[0]),
        **extra,
    )
