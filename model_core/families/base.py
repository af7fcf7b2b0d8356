"""What every model family tells the rest of the app: the Family interface and one forward pass's output."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

import numpy as np
import torch

from model_core.families.encoding import encode


@dataclass(frozen=True, eq=False)
class ForwardOutput:
    """The tensors of one forward pass over a padded batch, as every family reports them.

    Keys and values belong to the key/value heads (``kv_heads`` maps a query head to its one); queries are
    taken where the model takes them, so after the rotary embedding where there is one. A compact pass
    (``Family.forward(compact=True)``) keeps no weights and no values: its queries and keys, each layer's mask as the
    model passed it (``layer_masks``), and its scaling and softcap per layer.

    Shape:
        weights: layer tensors of (batch, head, q_pos, k_pos), softmax weights (masked heads zeroed); empty for a
            compact pass.
        queries: layer tensors of (batch, head, pos, d_head), or None when not asked for.
        keys, values: layer tensors of (batch, kv_head, pos, d_head), or None.
        hidden: layer + 1 tensors of (batch, pos, hidden): the embeddings, then each layer's output (the
            residual stream, before any final norm), or None.
        mask: (batch, q_pos, k_pos) bool, True where a query may attend to a key; None for a compact pass.
        class_logits: the chapter-3 encoder's classifier logits (batch, num_labels), else None.
        lm_logits: a decoder's next-token logits (batch, pos, vocab), else None.
        layer_masks: a compact pass's masks per layer, (batch, 1, q_pos, k_pos) additive or bool as the model passed
            them, None where the layer had none (layers of one kind share one tensor); else None.
        layer_scales, layer_softcaps: a compact pass's score scaling and softcap per layer; else None.
        model_output: the chapter-3 encoder's own output (its per-step records, which its walk reads), else None.
        past: a decoder's key/value cache after the pass (a transformers ``Cache``) when the pass was given one,
            else None.
    """

    weights: list[torch.Tensor]
    queries: list[torch.Tensor] | None
    keys: list[torch.Tensor] | None
    values: list[torch.Tensor] | None
    hidden: list[torch.Tensor] | None
    mask: torch.Tensor | None
    score_scale: float
    score_softcap: float | None = None
    class_logits: torch.Tensor | None = None
    lm_logits: torch.Tensor | None = None
    layer_masks: list[torch.Tensor | None] | None = None
    layer_scales: list[float] | None = None
    layer_softcaps: list[float | None] | None = None
    model_output: Any = None
    past: Any = None


class Family:
    """One model family's ways: its name, how it reads text, where its heads' tensors are, how heads are switched
    off. Subclasses override what their family does differently; one instance per family (``FAMILIES``).
    """

    name: ClassVar[str]
    label: ClassVar[str]
    """A few words for people, e.g. "Llama-like decoder"."""
    model_types: ClassVar[tuple[str, ...]] = ()
    """transformers' ``config.model_type`` values this family serves."""
    is_decoder: ClassVar[bool] = False
    auto_class: ClassVar[str] = "AutoModel"
    """Which transformers Auto class loads a checkpoint of this family."""
    pair_rule: ClassVar[str] = "[CLS] A [SEP] B [SEP]"
    """How a sentence pair becomes one input, said on the page."""
    word_rule: ClassVar[str] = "wordpiece"
    """How pieces join into words: "wordpiece" (a ``##`` piece continues) or "bpe" (a ``Ġ``/``▁`` piece starts)."""
    first_label: ClassVar[str] = "[CLS]"
    """What the analyses call position 0's share: "[CLS]" for encoders, "the first token" for decoders."""

    # -- shape ------------------------------------------------------------------------------------
    def max_positions(self, config: Any) -> int:
        """The longest input the model's positions allow."""
        return int(getattr(config, "max_position_embeddings", 512))

    def n_heads(self, config: Any) -> int:
        return int(config.num_attention_heads)

    def n_kv_heads(self, config: Any) -> int:
        return int(getattr(config, "num_key_value_heads", None) or self.n_heads(config))

    def n_layers(self, config: Any) -> int:
        return int(config.num_hidden_layers)

    def kv_heads(self, config: Any) -> np.ndarray:
        """The key/value head each query head reads (grouped-query attention). Shape: (head,) int64."""
        n, kv = self.n_heads(config), self.n_kv_heads(config)
        return np.arange(n, dtype=np.int64) // (n // kv)

    # -- text -------------------------------------------------------------------------------------
    def encode(self, tokenizer: Any, text: str, text_b: str = "", *, max_tokens: int, truncate: bool = False,
               limit_hint: str = "") -> Any:
        """One text or a pair as the model reads it (an ``EncodedInput``); see ``pair_rule``.

        Raises:
            InputError: the text cannot be traced; the message says what to change.
        """
        return encode(tokenizer, text, text_b, max_tokens=max_tokens, truncate=truncate, limit_hint=limit_hint)

    def special_tokens(self, tokenizer: Any) -> frozenset[str]:
        """The tokenizer's special tokens ([CLS], [SEP], <|endoftext|>, a BOS...)."""
        return frozenset(str(t) for t in getattr(tokenizer, "all_special_tokens", ()))

    # -- the model --------------------------------------------------------------------------------
    def forward(self, model: Any, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor | None, *, head_mask: torch.Tensor | None = None,
                vectors: bool = True, hidden: bool | str = True, compact: bool = False,
                on_layer: Callable[[int], None] | None = None) -> ForwardOutput:
        """Run the model once on a padded batch already on its device: the one forward route. The pass holds a turn
        of the route's gate (``model_core.gate.GATE``); a caller that turns the tensors into arrays holds
        its own turn around this call (the gate is re-entrant), so the pass's memory is freed before the next one.

        Args:
            head_mask: (layer, head) of 0/1 floats; 0 switches a head off (its output is zeroed before the output
                projection, as transformers' old ``head_mask`` did), or None.
            vectors: collect queries, keys and values.
            hidden: collect the hidden states; "last": the last layer's output alone.
            compact: attend with sdpa and keep queries and keys but no weights (a long input's compact trace).
            on_layer: called with each layer's index after its attention (a compact pass's progress).
        """
        raise NotImplementedError

    def parts(self, model: Any, layer: int) -> Any:
        """Block ``layer``'s modules by their job (a ``model_core.families.parts.BlockParts``)."""
        raise NotImplementedError

    def embed_parts(self, model: Any) -> Any:
        """The embedding modules and the final norm (a ``model_core.families.parts.EmbedParts``)."""
        raise NotImplementedError

    def block_notes(self, model: Any, layer: int) -> Any:
        """What the decoder walk's page says about block ``layer`` that differs by family (a
        ``model_core.families.parts.BlockNotes``): families with a block walk answer it."""
        raise NotImplementedError

    def output_weights(self, model: Any) -> list[torch.Tensor]:
        """Each layer's output projection, ``nn.Linear`` layout: (hidden, head * d_head)."""
        raise NotImplementedError

    def position_embeddings(self, model: Any, layer: int, n: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The rotary (cos, sin) that layer ``layer``'s attention applies at positions 0..n-1, as the model's forward
        passes them (batch first), without a pass; None where positions are not rotary."""
        return None

    def unembed(self, model: Any, hidden: torch.Tensor, rows: Sequence[int] | None = None) -> torch.Tensor:
        """The logit lens: the final norm and the unembedding applied to residual-stream vectors; ``rows``: only
        these tokens' logits.

        Shape: (..., hidden) -> (..., vocab), or (..., len(rows)).
        """
        raise ValueError(f"A {self.label} predicts no tokens; the logit lens needs a decoder language model.")
