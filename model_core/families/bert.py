"""BERT-like encoders (transformers' BertModel): WordPiece, [CLS] A [SEP] B [SEP], segment embeddings, no mask but
padding. Its attention goes through the same capturing function as the decoders'."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from model_core.families.hf import TransformersFamily


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
