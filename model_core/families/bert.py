"""BERT-like encoders (transformers' BertModel): WordPiece, [CLS] A [SEP] B [SEP], segment embeddings, no mask but
padding. Its attention goes through the same capturing function as the decoders'."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from model_core.families.hf import TransformersFamily
from model_core.families.parts import BlockParts, EmbedParts


class BertFamily(TransformersFamily):
    name: ClassVar[str] = "bert"
    label: ClassVar[str] = "BERT-like encoder"
    model_types: ClassVar[tuple[str, ...]] = ("bert",)
    uses_token_types: ClassVar[bool] = True

    def base(self, model: Any) -> Any:
        return model

    def layers(self, model: Any) -> list[Any]:
        return list(model.encoder.layer)

    def output_weights(self, model: Any) -> list[torch.Tensor]:
        return [layer.attention.output.dense.weight for layer in model.encoder.layer]

    def embed_parts(self, model: Any) -> EmbedParts:
        emb = model.embeddings
        return EmbedParts(embed=emb.word_embeddings, pos_embed=emb.position_embeddings,
                          type_embed=emb.token_type_embeddings, norm=emb.LayerNorm)

    def parts(self, model: Any, layer: int) -> BlockParts:
        block = model.encoder.layer[layer]
        out = block.attention.output
        return BlockParts(block=block, attn=block.attention.self, o_proj=out.dense, mlp=_BertMlp(block),
                          post_ln1=out.LayerNorm, post_ln2=block.output.LayerNorm,
                          values=block.attention.self.value, mlp_entry=block.intermediate,
                          mlp_exit=block.output.dense)

    def projection(self, model: Any, layer: int, kind: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        attn = model.encoder.layer[layer].attention.self
        proj = {"q": attn.query, "k": attn.key, "v": attn.value}[kind]
        return proj.weight, proj.bias


class _BertMlp(torch.nn.Module):
    """BERT's MLP as one module: ``intermediate`` then ``output.dense`` (its LayerNorm is the block's post_ln2)."""

    def __init__(self, block: Any) -> None:
        super().__init__()
        self.intermediate, self.dense = block.intermediate, block.output.dense

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(self.intermediate(x))
