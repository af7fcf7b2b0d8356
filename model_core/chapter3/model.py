"""The from-scratch transformer encoder of chapter 3 of *NLP with Transformers*, built bottom-up.

Every piece returns, next to its output, the intermediate tensors the app shows: queries, keys,
values, scores (QKᵀ/√d_head, before any mask), the mask, the masked scores (-inf where masked)
and the weights (after softmax). Three bugs of some notebook versions are avoided on purpose:
GELU sits between the two feed-forward linears, dropout takes its probability from the config
(never ``nn.Dropout()``'s 0.5), and residuals are added out of place.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from model_core.chapter3.config import EncoderConfig


# -- attention maths -----------------------------------------------------------------------
class AttentionStep(NamedTuple):
    """Every tensor of one scaled dot-product attention.

    Shape: scores, masked_scores, weights: (batch, q_pos, k_pos); output: (batch, q_pos, d_head);
    mask: broadcastable to scores, or None.
    """

    scores: torch.Tensor
    mask: torch.Tensor | None
    masked_scores: torch.Tensor
    weights: torch.Tensor
    output: torch.Tensor


def causal_mask(seq_len: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Lower-triangular mask: 1 where query i may attend to key j (j <= i), else 0.

    Shape: (q_pos, k_pos).
    """
    return torch.tril(torch.ones(seq_len, seq_len, device=device))


def attention_step(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None
) -> AttentionStep:
    """Scaled dot-product attention, keeping every intermediate tensor.

    Args:
        query: Shape: (batch, q_pos, d_head).
        key: Shape: (batch, k_pos, d_head).
        value: Shape: (batch, k_pos, d_head).
        mask: 1 where attending is allowed, 0 where not; broadcastable to (batch, q_pos, k_pos).
    """
    dim_k = query.size(-1)
    # Dividing by √d_head keeps the dot products' variance near 1 whatever the head size,
    # so the softmax does not saturate into a one-hot distribution with vanishing gradients.
    scores = torch.bmm(query, key.transpose(1, 2)) / math.sqrt(dim_k)  # (B, q_pos, k_pos)
    if mask is None:
        masked_scores = scores
    else:
        # exp(-inf) is exactly 0, so masked keys get exactly zero weight after the softmax.
        masked_scores = scores.masked_fill(mask == 0, float("-inf"))
    weights = F.softmax(masked_scores, dim=-1)
    return AttentionStep(scores, mask, masked_scores, weights, torch.bmm(weights, value))


def scaled_dot_product_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The book's ``scaled_dot_product_attention``, with an optional mask.

    Shape: query (batch, q_pos, d_head), key/value (batch, k_pos, d_head) -> (batch, q_pos, d_head).
    """
    return attention_step(query, key, value, mask).output


# -- modules, bottom-up -----------------------------------------------------------------------
class HeadRecord(NamedTuple):
    """One head's tensors. Shape: query/key/value (batch, pos, d_head); the rest as AttentionStep."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    step: AttentionStep


class AttentionHead(nn.Module):
    """One attention head with its own query, key and value projections."""

    def __init__(self, embed_dim: int, head_dim: int) -> None:
        super().__init__()
        self.q = nn.Linear(embed_dim, head_dim)
        self.k = nn.Linear(embed_dim, head_dim)
        self.v = nn.Linear(embed_dim, head_dim)

    def forward(self, hidden_state: torch.Tensor, mask: torch.Tensor | None = None) -> HeadRecord:
        query, key, value = self.q(hidden_state), self.k(hidden_state), self.v(hidden_state)
        return HeadRecord(query, key, value, attention_step(query, key, value, mask))


class MultiHeadAttention(nn.Module):
    """Heads side by side; their outputs are concatenated and mixed by the output linear."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.heads = nn.ModuleList(
            [AttentionHead(config.hidden_size, config.head_dim) for _ in range(config.num_attention_heads)]
        )
        self.output_linear = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(
        self, hidden_state: torch.Tensor, mask: torch.Tensor | None = None, head_gate: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[HeadRecord], torch.Tensor]:
        """Returns the output, each head's record, and the concatenated heads.

        Args:
            head_gate: 1 keeps a head, 0 switches it off (its weights and output become 0).
                Shape: (head,).
        """
        records = [head(hidden_state, mask) for head in self.heads]
        if head_gate is not None:
            records = [_gate(record, head_gate[i]) for i, record in enumerate(records)]
        concat = torch.cat([r.step.output for r in records], dim=-1)  # (B, pos, hidden)
        return self.output_linear(concat), records, concat


def _gate(record: HeadRecord, gate: torch.Tensor) -> HeadRecord:
    """Scale a head's weights (and so its output) by ``gate``, as BERT's old ``head_mask`` did."""
    step = record.step
    weights = step.weights * gate
    return record._replace(step=step._replace(weights=weights, output=step.output * gate))


class FeedForward(nn.Module):
    """Position-wise feed-forward: linear -> GELU -> linear -> dropout."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.linear_1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.linear_2 = nn.Linear(config.intermediate_size, config.hidden_size)
        self.gelu = nn.GELU()
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.linear_2(self.gelu(self.linear_1(x))))


class LayerRecord(NamedTuple):
    """One encoder layer's tensors: its heads, the concatenated heads, and its output.

    Shape: concat, attention_output, output: (batch, pos, hidden).
    """

    heads: list[HeadRecord]
    concat: torch.Tensor
    attention_output: torch.Tensor
    output: torch.Tensor


class TransformerEncoderLayer(nn.Module):
    """Attention and feed-forward sublayers with residuals; LayerNorm before (book) or after (BERT)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.norm_placement = config.norm_placement
        self.layer_norm_1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.layer_norm_2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = MultiHeadAttention(config)
        self.attention_output_dropout = nn.Dropout(config.hidden_dropout_prob)  # on the sublayer output, as BERT
        self.feed_forward = FeedForward(config)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None = None, head_gate: torch.Tensor | None = None
    ) -> LayerRecord:
        if self.norm_placement == "pre":
            # Pre-LN (the book): normalise the sublayer's input, keep the residual stream raw.
            attn, heads, concat = self.attention(self.layer_norm_1(x), mask, head_gate)
            x = x + self.attention_output_dropout(attn)
            x = x + self.feed_forward(self.layer_norm_2(x))
        else:
            # Post-LN (BERT): add the residual, then normalise the sum.
            attn, heads, concat = self.attention(x, mask, head_gate)
            x = self.layer_norm_1(x + self.attention_output_dropout(attn))
            x = self.layer_norm_2(x + self.feed_forward(x))
        return LayerRecord(heads, concat, attn, x)


class Embeddings(nn.Module):
    """Token + learned position + token-type embeddings, then LayerNorm and dropout."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.token_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Shape: input_ids (batch, pos) -> (batch, pos, hidden)."""
        seq_length = input_ids.size(1)
        position_ids = torch.arange(seq_length, dtype=torch.long, device=input_ids.device).unsqueeze(0)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        embeddings = (
            self.token_embeddings(input_ids)
            + self.position_embeddings(position_ids)
            + self.token_type_embeddings(token_type_ids)
        )
        return self.dropout(self.layer_norm(embeddings))


class EncoderOutput(NamedTuple):
    """Everything the encoder computed.

    Shape: last_hidden_state (batch, pos, hidden); hidden_states: layer + 1 tensors of that shape;
    mask: (batch, q_pos, k_pos) or None.
    """

    last_hidden_state: torch.Tensor
    hidden_states: list[torch.Tensor]
    layers: list[LayerRecord]
    mask: torch.Tensor | None


class TransformerEncoder(nn.Module):
    """Embeddings followed by a stack of encoder layers."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList([TransformerEncoderLayer(config) for _ in range(config.num_hidden_layers)])

    def build_mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """Combine the causal mask and the padding mask; 1 = may attend.

        Shape: input_ids (batch, pos); attention_mask (batch, k_pos) -> (batch, q_pos, k_pos) or None.
        """
        batch, seq_len = input_ids.shape
        mask = None
        if self.config.causal:
            mask = causal_mask(seq_len, input_ids.device).unsqueeze(0).expand(batch, -1, -1)
        if attention_mask is not None:
            padding = attention_mask[:, None, :].to(torch.float32).expand(-1, seq_len, -1)  # (B, q, k)
            mask = padding if mask is None else mask * padding
        return mask

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        head_mask: torch.Tensor | None = None,
    ) -> EncoderOutput:
        """Run the encoder.

        Args:
            input_ids: Shape: (batch, pos).
            token_type_ids: Shape: (batch, pos).
            attention_mask: 1 for real tokens, 0 for padding. Shape: (batch, pos).
            head_mask: 1 keeps a head, 0 switches it off. Shape: (layer, head).
        """
        mask = self.build_mask(input_ids, attention_mask)
        x = self.embeddings(input_ids, token_type_ids)
        hidden_states, records = [x], []
        for i, layer in enumerate(self.layers):
            record = layer(x, mask, None if head_mask is None else head_mask[i])
            x = record.output
            hidden_states.append(x)
            records.append(record)
        return EncoderOutput(x, hidden_states, records, mask)


class ClassifierOutput(NamedTuple):
    """Shape: logits (batch, num_labels)."""

    logits: torch.Tensor
    encoder: EncoderOutput


class TransformerForSequenceClassification(nn.Module):
    """The encoder with a classification head on the [CLS] token: [CLS] -> dropout -> linear."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = TransformerEncoder(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, head_mask: torch.Tensor | None = None) -> ClassifierOutput:
        encoded = self.encoder(input_ids, token_type_ids, attention_mask, head_mask)
        cls = encoded.last_hidden_state[:, 0, :]  # (B, hidden)
        return ClassifierOutput(self.classifier(self.dropout(cls)), encoded)


def build_random_model(config: EncoderConfig, seed: int = 0) -> TransformerForSequenceClassification:
    """A seeded, randomly initialised encoder in eval mode (same seed, same weights)."""
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = TransformerForSequenceClassification(config)
    finally:
        torch.random.set_rng_state(generator_state)
    return model.eval()
