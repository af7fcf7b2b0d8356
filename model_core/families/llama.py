"""Llama-like decoders: Llama, Qwen2/3, Mistral, Gemma 1-3, Phi-3 and Phi. Rotary embeddings (queries and keys are
recorded after them), grouped-query attention (``num_key_value_heads``), RMSNorm, a gated MLP. Gemma scales its
scores by ``query_pre_attn_scalar``; the capturing function records whatever scaling the model passes."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from model_core.families.decoder import DecoderFamily


class LlamaFamily(DecoderFamily):
    name: ClassVar[str] = "llama"
    label: ClassVar[str] = "Llama-like decoder"
    model_types: ClassVar[tuple[str, ...]] = (
        "llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "phi3", "phi", "smollm3", "olmo2",
    )

    def base(self, model: Any) -> Any:
        return model.model

    def layers(self, model: Any) -> list[Any]:
        return list(model.model.layers)

    def final_norm(self, model: Any) -> Any:
        base = model.model
        return base.norm if hasattr(base, "norm") else base.final_layernorm  # Phi calls it final_layernorm

    def output_weights(self, model: Any) -> list[torch.Tensor]:
        out = []
        for layer in model.model.layers:
            attn = layer.self_attn
            out.append((attn.o_proj if hasattr(attn, "o_proj") else attn.dense).weight)  # Phi: dense
        return out
