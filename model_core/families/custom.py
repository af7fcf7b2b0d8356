"""The chapter-3 encoder (``model_core.chapter3.model``): our own module records every head's tensors itself."""

from __future__ import annotations

import math
from typing import Any, Callable, ClassVar

import torch

from model_core.families.base import Family, ForwardOutput
from model_core.families.parts import BlockParts, EmbedParts
from model_core.gate import GATE


class CustomFamily(Family):
    name: ClassVar[str] = "custom"
    label: ClassVar[str] = "chapter-3 encoder"

    def forward(self, model: Any, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor | None, *, head_mask: torch.Tensor | None = None,
                vectors: bool = True, hidden: bool | str = True, compact: bool = False,
                on_layer: Callable[[int], None] | None = None, grad: bool = False) -> ForwardOutput:
        """As ``Family.forward``; ``model_output`` is the encoder's own output, whose records its walk reads.
        ``grad``: run with autograd (gradients at hook points), else in inference mode."""
        if compact:
            raise ValueError("A compact trace is made for pretrained models (any supported family); the chapter-3 "
                             "encoder is traced in full (export without --compact).")
        with GATE.turn(), torch.inference_mode(not grad):
            out = model(input_ids, token_type_ids, attention_mask, head_mask=head_mask)
        with torch.inference_mode(not grad):
            return self._output(model, input_ids, out, vectors, hidden)

    def _output(self, model: Any, input_ids: torch.Tensor, out: Any, vectors: bool, hidden: bool | str
                ) -> ForwardOutput:
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

    def embed_parts(self, model: Any) -> EmbedParts:
        emb = model.encoder.embeddings
        return EmbedParts(embed=emb.token_embeddings, pos_embed=emb.position_embeddings,
                          type_embed=emb.token_type_embeddings, norm=emb.layer_norm)

    def block_parts(self, model: Any, layer: int) -> dict[str, tuple[torch.nn.Module, str]]:
        """The modules of layer ``layer`` that the encoder walk (``model_core.walk.encoder``) reads: name -> (module,
        "input" or "output")."""
        emb, block = model.encoder.embeddings, model.encoder.layers[layer]
        ffn = block.feed_forward
        return {
            "token_embeddings": (emb.token_embeddings, "output"),
            "position_embeddings": (emb.position_embeddings, "output"),
            "token_type_embeddings": (emb.token_type_embeddings, "output"),
            "embedding_sum": (emb.layer_norm, "input"),
            "ln1_in": (block.layer_norm_1, "input"), "ln1_out": (block.layer_norm_1, "output"),
            "ln2_in": (block.layer_norm_2, "input"), "ln2_out": (block.layer_norm_2, "output"),
            "ffn_input": (ffn.linear_1, "input"), "ffn_hidden": (ffn.linear_1, "output"),
            "ffn_activation": (ffn.gelu, "output"), "ffn_output": (ffn, "output"),
        }

    def parts(self, model: Any, layer: int) -> BlockParts:
        block = model.encoder.layers[layer]
        attn = block.attention
        post = block.norm_placement == "post"
        return BlockParts(block=block, attn=attn, o_proj=attn.output_linear, mlp=block.feed_forward,
                          ln1=None if post else block.layer_norm_1, ln2=None if post else block.layer_norm_2,
                          post_ln1=block.layer_norm_1 if post else None, post_ln2=block.layer_norm_2 if post else None)
