"""Load a BERT checkpoint's weights into the from-scratch encoder (post-LayerNorm mode)."""

from __future__ import annotations

import torch
from torch import nn

from model_core.chapter3.config import EncoderConfig
from model_core.chapter3.model import TransformerForSequenceClassification, build_random_model


def _copy(dst: nn.Module, src: nn.Module) -> None:
    dst.weight.copy_(src.weight)
    if getattr(dst, "bias", None) is not None:
        dst.bias.copy_(src.bias)


@torch.no_grad()
def custom_from_bert(bert_model: nn.Module, seed: int = 0, **overrides) -> TransformerForSequenceClassification:
    """A custom encoder carrying ``bert_model``'s weights; the classifier head stays random (seeded).

    BERT fuses the heads into one query, key and value matrix of shape (hidden, hidden); rows
    ``h*d_head:(h+1)*d_head`` belong to head ``h`` and become that AttentionHead's projection.

    Args:
        bert_model: a ``transformers`` BertModel (eval mode).
        seed: seed of the classifier head.
        overrides: EncoderConfig fields to change, e.g. ``causal=True`` (post-LN stays, so the
            weights keep their meaning; a causal BERT is an illustration, not what BERT learned).
    """
    config = EncoderConfig.from_bert_config(bert_model.config, **overrides)
    model = build_random_model(config, seed)
    emb, src_emb = model.encoder.embeddings, bert_model.embeddings
    _copy(emb.token_embeddings, src_emb.word_embeddings)
    _copy(emb.position_embeddings, src_emb.position_embeddings)
    _copy(emb.token_type_embeddings, src_emb.token_type_embeddings)
    _copy(emb.layer_norm, src_emb.LayerNorm)
    d_head = config.head_dim
    for layer, src in zip(model.encoder.layers, bert_model.encoder.layer):
        self_attn = src.attention.self
        for h, head in enumerate(layer.attention.heads):
            rows = slice(h * d_head, (h + 1) * d_head)
            for mine, theirs in ((head.q, self_attn.query), (head.k, self_attn.key), (head.v, self_attn.value)):
                mine.weight.copy_(theirs.weight[rows])
                mine.bias.copy_(theirs.bias[rows])
        _copy(layer.attention.output_linear, src.attention.output.dense)
        _copy(layer.layer_norm_1, src.attention.output.LayerNorm)
        _copy(layer.feed_forward.linear_1, src.intermediate.dense)
        _copy(layer.feed_forward.linear_2, src.output.dense)
        _copy(layer.layer_norm_2, src.output.LayerNorm)
    return model.eval()
