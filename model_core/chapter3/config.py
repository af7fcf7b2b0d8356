"""EncoderConfig: the one frozen, validated configuration of the from-scratch encoder."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal

NormPlacement = Literal["pre", "post"]


@dataclass(frozen=True)
class EncoderConfig:
    """Shape and options of the chapter-3 encoder. The defaults are bert-base-uncased's shape.

    Attributes:
        vocab_size: rows of the token embedding (BERT's WordPiece vocabulary).
        hidden_size: width of the residual stream, d_model.
        num_hidden_layers: encoder layers.
        num_attention_heads: heads per layer; must divide ``hidden_size``.
        intermediate_size: width of the feed-forward layer.
        max_position_embeddings: rows of the learned position embedding.
        type_vocab_size: token types (2: sentence A and B).
        hidden_dropout_prob: dropout after embeddings, feed-forward and classifier input.
        layer_norm_eps: LayerNorm epsilon.
        norm_placement: "pre" (the book's pre-LayerNorm) or "post" (BERT's).
        causal: mask every key to the right of its query.
        num_labels: outputs of the classifier head.
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout_prob: float = 0.1
    layer_norm_eps: float = 1e-12
    norm_placement: NormPlacement = "pre"
    causal: bool = False
    num_labels: int = 2

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size", "num_labels"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}); pick, e.g., hidden_size="
                f"{self.num_attention_heads * max(1, self.hidden_size // self.num_attention_heads)}."
            )
        if not 0.0 <= self.hidden_dropout_prob < 1.0:
            raise ValueError(f"hidden_dropout_prob must be in [0, 1), got {self.hidden_dropout_prob}.")
        if self.norm_placement not in ("pre", "post"):
            raise ValueError(f"norm_placement must be 'pre' or 'post', got {self.norm_placement!r}.")
        if self.layer_norm_eps <= 0:
            raise ValueError(f"layer_norm_eps must be positive, got {self.layer_norm_eps}.")

    @property
    def head_dim(self) -> int:
        """d_head = hidden_size / num_attention_heads."""
        return self.hidden_size // self.num_attention_heads

    def replace(self, **changes: Any) -> "EncoderConfig":
        """A copy with ``changes`` applied (and validated)."""
        return replace(self, **changes)

    @classmethod
    def from_bert_config(cls, bert_config: Any, **overrides: Any) -> "EncoderConfig":
        """Build from a ``transformers`` BertConfig; BERT is post-LayerNorm.

        Raises:
            ValueError: the config uses an activation or position scheme this encoder lacks.
        """
        act = getattr(bert_config, "hidden_act", "gelu")
        if act != "gelu":
            raise ValueError(f"hidden_act={act!r} is not supported; the encoder uses exact GELU.")
        pos = getattr(bert_config, "position_embedding_type", "absolute")
        if pos not in (None, "absolute"):
            raise ValueError(f"position_embedding_type={pos!r} is not supported; only absolute positions.")
        values = {
            "vocab_size": bert_config.vocab_size,
            "hidden_size": bert_config.hidden_size,
            "num_hidden_layers": bert_config.num_hidden_layers,
            "num_attention_heads": bert_config.num_attention_heads,
            "intermediate_size": bert_config.intermediate_size,
            "max_position_embeddings": bert_config.max_position_embeddings,
            "type_vocab_size": bert_config.type_vocab_size,
            "hidden_dropout_prob": bert_config.hidden_dropout_prob,
            "layer_norm_eps": bert_config.layer_norm_eps,
            "norm_placement": "post",
        }
        values.update(overrides)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})
