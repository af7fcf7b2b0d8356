"""GPT-2: learned positions, one fused c_attn, Conv1D weights stored (in, out)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from model_core.families.decoder import DecoderFamily


class GPT2Family(DecoderFamily):
    name: ClassVar[str] = "gpt2"
    label: ClassVar[str] = "GPT-2 decoder"
    model_types: ClassVar[tuple[str, ...]] = ("gpt2",)

    def max_positions(self, config: Any) -> int:
        return int(config.n_positions)

    def n_heads(self, config: Any) -> int:
        return int(config.n_head)

    def n_kv_heads(self, config: Any) -> int:
        return int(config.n_head)

    def n_layers(self, config: Any) -> int:
        return int(config.n_layer)

    def base(self, model: Any) -> Any:
        return model.transformer

    def layers(self, model: Any) -> list[Any]:
        return list(model.transformer.h)

    def final_norm(self, model: Any) -> Any:
        return model.transformer.ln_f

    def output_weights(self, model: Any) -> list[torch.Tensor]:
        return [block.attn.c_proj.weight.T for block in model.transformer.h]  # Conv1D keeps (in, out)
