"""The chapter-3 encoder (``model_core.chapter3.model``): our own module records every head's tensors itself."""

from __future__ import annotations

import math
from typing import Any, Callable, ClassVar

import torch

from model_core.families.base import Family, ForwardOutput
from model_core.trace.gate import GATE


class CustomFamily(Family):
    name: ClassVar[str] = "custom"
    label: ClassVar[str] = "chapter-3 encoder"

    @torch.inference_mode()
    def forward(self, model: Any, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor | None, *, head_mask: torch.Tensor | None = None,
                vectors: bool = True, hidden: bool | str = True, compact: bool = False,
                on_layer: Callable[[int], None] | None = None) -> ForwardOutput:
        """As ``Family.forward``; ``model_output`` is the encoder's own output, whose records its walk reads."""
        if compact:
            raise ValueError("A compact trace is made for pretrained models (any supported family); the chapter-3 "
                             "encoder is traced in full (export without --compact).")
        with GATE.turn():
            out = model(input_ids, token_type_ids, attention_mask, head_mask=head_mask)
        enc = out.encoder
        stack = lambda attr: [torch.stack([getattr(h, attr) for h in layer.heads], dim=1)  # noqa: E731
                              for layer in enc.layers]  # layer tensors of (batch, head, pos, d_head)
        n = input_ids.shape[1]
        mask = (torch.ones(len(input_ids), n, n, dtype=torch.bool, device=input_ids.device) if enc.mask is None
                else enc.mask > 0.5)
        d_head = model.config.hidden_size // model.config.num_attention_heads
        return ForwardOutput(
            weights=[torch.stack([h.step.weights for h in layer.heads], dim=1) for layer in enc.layers],
            queries=stack("query") if vectors else None,
            keys=stack("key") if vectors else None,
            values=stack("value") if vectors else None,
            hidden=(list(enc.hidden_states) if hidden is True else [enc.hidden_states[-1]]) if hidden else None,
            mask=mask,
            score_scale=1.0 / math.sqrt(d_head),
            class_logits=out.logits,
            model_output=out,
        )

    def output_weights(self, model: Any) -> list[torch.Tensor]:
        return [layer.attention.output_linear.weight for layer in model.encoder.layers]
