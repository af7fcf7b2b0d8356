"""Llama-like decoders: Llama, Qwen2/3, Mistral, Gemma 1-3, Phi-3 and Phi. Rotary embeddings (queries and keys are
recorded after them), grouped-query attention (``num_key_value_heads``), RMSNorm, a gated MLP. Gemma scales its
scores by ``query_pre_attn_scalar``; the capturing function records whatever scaling the model passes."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import torch

from model_core.families.decoder import DecoderFamily, NoBlockWalk
from model_core.families.hook_attention import apply_rotary
from model_core.families.parts import (
    BlockNotes,
    BlockParts,
    EmbedParts,
    adds_one,
    norm_eps,
)


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

    def embed_parts(self, model: Any) -> EmbedParts:
        # Gemma's sqrt(d_model) is inside its embedding module (transformers' ScaledWordEmbedding).
        return EmbedParts(embed=model.model.embed_tokens, final_norm=self.final_norm(model))

    def parts(self, model: Any, layer: int) -> BlockParts:
        block = model.model.layers[layer]
        attn = block.self_attn
        post_ffn = getattr(block, "post_feedforward_layernorm", None)
        parallel = getattr(block, "post_attention_layernorm", None) is None and post_ffn is None  # Phi-1/2
        if post_ffn is not None:  # Gemma 2/3, OLMo 2: each sublayer's output is normed before the sum
            attn_post, ln2 = block.post_attention_layernorm, getattr(block, "pre_feedforward_layernorm", None)
        else:
            attn_post, ln2 = None, None if parallel else block.post_attention_layernorm
        heads_norm = self._per_head_norms(model, attn)
        return BlockParts(block=block, attn=attn, o_proj=attn.o_proj if hasattr(attn, "o_proj") else attn.dense,
                          mlp=block.mlp, ln1=getattr(block, "input_layernorm", None), ln2=ln2,
                          attn_post_norm=attn_post, mlp_post_norm=post_ffn, parallel=parallel,
                          values=_llama_values(block, model.config), q_norm=heads_norm[0], k_norm=heads_norm[1])

    def projection(self, model: Any, layer: int, kind: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        attn = model.model.layers[layer].self_attn
        if getattr(attn, "qk_layernorm", False) or (model.config.model_type == "olmo2"):
            raise ValueError(f"Split inputs are not supported for {model.config.model_type}: its query/key norm spans "
                             "every head, so one head's query cannot be computed alone.")
        proj = getattr(attn, f"{kind}_proj", None)
        if proj is not None:
            return proj.weight, proj.bias
        # Phi-3: one fused qkv_proj, rows q (heads), then k and v (kv heads each)
        n_q = model.config.num_attention_heads * attn.head_dim
        n_kv = model.config.num_key_value_heads * attn.head_dim
        start, stop = {"q": (0, n_q), "k": (n_q, n_q + n_kv), "v": (n_q + n_kv, n_q + 2 * n_kv)}[kind]
        fused = attn.qkv_proj
        return fused.weight[start:stop], None if fused.bias is None else fused.bias[start:stop]

    def rotary(self, attn: Any, q: torch.Tensor, k: torch.Tensor, rope: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return apply_rotary(attn, q, k, rope)

    @staticmethod
    def _per_head_norms(model: Any, attn: Any) -> tuple[Any, Any]:
        """Qwen3's and Gemma 3's per-head query and key norms (OLMo 2 norms the whole projection instead, which is
        part of its projection here; Phi's optional ``q_layernorm`` likewise)."""
        q, k = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        if q is None or model.config.model_type == "olmo2":
            return None, None
        return q, k

    def output_weights(self, model: Any) -> list[torch.Tensor]:
        out = []
        for layer in model.model.layers:
            attn = layer.self_attn
            out.append((attn.o_proj if hasattr(attn, "o_proj") else attn.dense).weight)  # Phi: dense
        return out

    def position_embeddings(self, model: Any, layer: int, n: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        rotary = model.model.rotary_emb
        param = next(model.parameters())
        x = torch.zeros(1, n, 1, dtype=param.dtype, device=param.device)  # the module reads only dtype and device
        positions = torch.arange(n, device=param.device)[None]
        types = getattr(model.config, "layer_types", None)
        with torch.no_grad():
            if types is not None and "layer_type" in inspect.signature(rotary.forward).parameters:  # Gemma 3
                return rotary(x, positions, types[layer])
            return rotary(x, positions)

    def block_notes(self, model: Any, layer: int) -> BlockNotes:
        parts = self.parts(model, layer)
        config = model.config
        act = str(getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu"))  # Gemma: GELU
        scale = getattr(model.model.embed_tokens, "embed_scale", None)  # Gemma's lookup multiplies by √hidden
        return BlockNotes(norm_eps=norm_eps(parts.ln1), norm_plus_one=adds_one(parts.ln1),
                          qk_norm=parts.q_norm is not None, sandwich=parts.attn_post_norm is not None,
                          activation="SiLU" if act in ("silu", "swish") else "GELU" if act.startswith("gelu") else act,
                          lookup_scale=1.0 if scale is None else float(scale))

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
        parts = self.parts(model, layer)
        # The MLP's own norm (Gemma 2/3: not the post-attention norm, which is on the attention output) reads resid_mid.
        pre_mlp = parts.ln2
        # Qwen3 and Gemma 3 normalise each head's query and key before the rotary embedding: read them after it.
        q_before = attn.q_proj if parts.q_norm is None else parts.q_norm
        k_before = attn.k_proj if parts.k_norm is None else parts.k_norm
        return {
            "token_embeddings": (base.embed_tokens, "output"),
            "attention_input": (block.input_layernorm, "output"),
            "q_before": (q_before, "output"), "k_before": (k_before, "output"),
            "concat": (attn.o_proj, "input"), "attention_output": (attn.o_proj, "output"),
            "residual_1": (pre_mlp, "input"), "ffn_input": (mlp, "input"),
            "gate": (mlp.gate_proj, "output"), "up": (mlp.up_proj, "output"), "activation": (mlp.act_fn, "output"),
            "gated": (mlp.down_proj, "input"), "ffn_output": (mlp, "output"),
        }


def _llama_values(block: Any, config: Any):
    """A Llama-like block's values from its input: its input norm (where it has one), then v_proj (Phi-3: the last
    third of the fused qkv_proj), then any per-head value norm. Shape: (..., d_model) -> (..., kv_head * d_head)."""
    attn = block.self_attn
    norm = getattr(block, "input_layernorm", None)

    def values(x: torch.Tensor) -> torch.Tensor:
        h = x if norm is None else norm(x.to(_dtype(norm)))
        if hasattr(attn, "v_proj"):
            v = attn.v_proj(h)
        else:  # Phi-3: rows are q (heads), then k and v (kv_heads each)
            qkv = attn.qkv_proj(h)
            v = qkv[..., -config.num_key_value_heads * attn.head_dim:]
        v_norm = getattr(attn, "v_norm", None)
        if v_norm is not None:
            v = v_norm(v.view(*v.shape[:-1], -1, attn.head_dim)).flatten(-2)
        return v
    return values


def _dtype(module: Any) -> torch.dtype:
    p = next(module.parameters(), None)
    return torch.float32 if p is None else p.dtype
