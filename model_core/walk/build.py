"""Build a walk for a request: ``build_walkthrough`` walks one layer on the tokens of the request's trace, in the
chapter-3 encoder (an encoder's) or in the model itself (a Llama-like decoder's block)."""

from __future__ import annotations

import torch

from model_core.settings import Settings
from model_core.trace.request import TraceRequest
from model_core.trace.resolve import Models, resolve
from model_core.trace.trace import AttentionTrace
from model_core.walk.decoder import DecoderWalk, walk_decoder_layer
from model_core.walk.encoder import Walkthrough, encoded_from_trace, walk_layer

__all__ = ["build_walkthrough"]


def build_walkthrough(request: TraceRequest, layer: int, trace: AttentionTrace, *,
                      device: str | torch.device | None = None, settings: Settings | None = None,
                      models: Models | None = None) -> Walkthrough | DecoderWalk:
    """Walk through ``layer`` on the tokens of ``trace``, the trace ``build_trace(request)`` gave, so the walk reads
    exactly what every page reads: an encoder's in the chapter-3 encoder (``TraceRequest.walk_spec``), a
    Llama-like decoder's block in the model itself (``model_core.walk.decoder.DecoderWalk``).

    Raises:
        ValueError: the layer does not exist, an option is out of range, or the decoder's family has no block walk
            (GPT-2, Phi).
    """
    resolved = resolve(request, device=device, settings=settings, models=models, walk=not trace.is_decoder)
    if trace.is_decoder:  # a decoder block's own walk (Llama-like families; the others say why not)
        return walk_decoder_layer(resolved.family, resolved.model, resolved.tokenizer, trace, layer)
    return walk_layer(resolved.model, encoded_from_trace(trace), layer)
