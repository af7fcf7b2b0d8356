"""What identifies one custom encoder (CustomSpec); ``model_core.models.custom`` builds it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from model_core.chapter3.config import EncoderConfig
from model_core.chapter3.model import TransformerForSequenceClassification


@dataclass(frozen=True, kw_only=True)
class CustomOptions:
    """The custom encoder's options: the fields ``CustomSpec`` (one encoder) and ``TraceRequest`` (one trace)
    share, so that both name them once.

    Attributes:
        weights: "random" (seeded) or "pretrained" (a BERT checkpoint's weights).
        seed: seeds the random weights (and the classifier head of pretrained ones).
        causal: apply the causal mask.
        norm_placement: "pre" (the book) or "post" (BERT) LayerNorm.
        num_hidden_layers, num_attention_heads, hidden_size: the shape, for random weights.
    """

    weights: Literal["random", "pretrained"] = "random"
    seed: int = 0
    causal: bool = False
    norm_placement: Literal["pre", "post"] = "pre"
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    hidden_size: int = 768


@dataclass(frozen=True, kw_only=True)
class CustomSpec(CustomOptions):
    """What identifies one custom encoder: its options, and the BERT whose weights it takes.

    ``weights="pretrained"`` takes the shape of ``model_id``'s BERT and forces post-LayerNorm.
    """

    model_id: str | None = None

    def __post_init__(self) -> None:
        if self.weights not in ("random", "pretrained"):
            raise ValueError(f"weights must be 'random' or 'pretrained', got {self.weights!r}.")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be between 0 and {2**32 - 1}, got {self.seed}.")
        if self.weights == "random":
            self.config()  # validates the shape

    def config(self) -> EncoderConfig:
        """The encoder's config for random weights (intermediate size 4x hidden, as in BERT)."""
        return EncoderConfig(
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=4 * self.hidden_size,
            norm_placement=self.norm_placement,
            causal=self.causal,
        )


def describe_custom(spec: CustomSpec, model: TransformerForSequenceClassification) -> str:
    """One line naming the custom encoder's weights and shape."""
    c = model.config
    weights = (f"BERT weights from {spec.model_id or 'the bundled model'}" if spec.weights == "pretrained"
               else f"random weights, seed {spec.seed}")
    return (f"Custom encoder ({weights}; {c.num_hidden_layers} layers x {c.num_attention_heads} heads, hidden "
            f"{c.hidden_size}, {c.norm_placement}-LayerNorm, {'causal' if c.causal else 'bidirectional'})")
