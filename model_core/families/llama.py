"""Llama-like decoders: Llama, Qwen2/3, Mistral, Gemma 1-3, Phi-3 and Phi. Rotary embeddings (queries and keys are
recorded after them), grouped-query attention (``num_key_value_heads``), RMSNorm, a gated MLP. Gemma scales its
scores by ``query_pre_attn_scalar``; the capturing function records whatever scaling the model passes."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from model_core.families.decoder import DecoderFamily, NoBlockWalk


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

    def block_parts(self, model: Any, layer: int) -> dict[str, tuple[torch.nn.Module, str]]:
        """The modules of block ``layer`` the walk reads: name -> (module, "input" or "output").

        Raises:
            NoBlockWalk: the block has no separate q/k/v projections or no gated MLP (Phi's and Phi-3's fused ones).
        """
        base = model.model
        block = base.layers[layer]
        attn, mlp = block.self_attn, getattr(block, "mlp", None)
        needed = [getattr(attn, name, None) for name in ("q_proj", "k_proj", "v_proj", "o_proj")]
        needed += [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj", "act_fn")]
        needed += [getattr(block, "input_layernorm", None), getattr(block, "post_attention_layernorm", None)]
        if any(part is None for part in needed):
            raise NoBlockWalk(f"The block walk needs separate q/k/v projections and a gated MLP; "
                             f"{model.config.model_type} fuses them, so walk a Llama, Qwen, Mistral, Gemma or SmolLM2 "
                             "model instead. Its attention is on every other page.")
        # Gemma 2/3 normalise the attention output before the residual sum and have a norm of their own before the MLP.
        pre_mlp = _either(block, "pre_feedforward_layernorm", block.post_attention_layernorm)
        # Qwen3 and Gemma 3 normalise each head's query and key before the rotary embedding: read them after it.
        q_before, k_before = _either(attn, "q_norm", attn.q_proj), _either(attn, "k_norm", attn.k_proj)
        return {
            "token_embeddings": (base.embed_tokens, "output"),
            "attention_input": (block.input_layernorm, "output"),
            "q_before": (q_before, "output"), "k_before": (k_before, "output"),
            "concat": (attn.o_proj, "input"), "attention_output": (attn.o_proj, "output"),
            "residual_1": (pre_mlp, "input"), "ffn_input": (mlp, "input"),
            "gate": (mlp.gate_proj, "output"), "up": (mlp.up_proj, "output"), "activation": (mlp.act_fn, "output"),
            "gated": (mlp.down_proj, "input"), "ffn_output": (mlp, "output"),
        }


def _either(owner: Any, name: str, default: torch.nn.Module) -> torch.nn.Module:
    """``owner.name`` where the model has that module, else ``default``."""
    found = getattr(owner, name, None)
    return default if found is None else found
