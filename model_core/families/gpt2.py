"""GPT-2: learned positions, one fused c_attn, Conv1D weights stored (in, out)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from model_core.families.decoder import DecoderFamily
from model_core.families.parts import BlockParts, EmbedParts


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

    def embed_parts(self, model: Any) -> EmbedParts:
        t = model.transformer
        return EmbedParts(embed=t.wte, pos_embed=t.wpe, final_norm=t.ln_f)

    def parts(self, model: Any, layer: int) -> BlockParts:
        block = model.transformer.h[layer]
        d = block.attn.c_proj.weight.shape[0]
        values = lambda x: block.attn.c_attn(block.ln_1(x))[..., 2 * d:]  # noqa: E731  c_attn: q, k, v side by side
        return BlockParts(block=block, attn=block.attn, o_proj=block.attn.c_proj, mlp=block.mlp, ln1=block.ln_1,
                          ln2=block.ln_2, values=values)

    def projection(self, model: Any, layer: int, kind: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        c_attn = model.transformer.h[layer].attn.c_attn  # Conv1D: weight (d_model, 3 * d_model), q | k | v
        d = c_attn.weight.shape[0]
        i = "qkv".index(kind)
        return c_attn.weight[:, i * d:(i + 1) * d].T, c_attn.bias[i * d:(i + 1) * d]
