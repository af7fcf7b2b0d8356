"""What every decoder language model shares: a causal mask, no [CLS]/[SEP], next-token logits and the logit lens.
GPT-2 and the Llama-like families say where their parts are (``gpt2.py``, ``llama.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from model_core.families.encoding import encode_decoder
from model_core.families.hf import TransformersFamily


class NoBlockWalk(ValueError):
    """This model's blocks have no step-by-step walk (GPT-2, Phi's fused projections); the message says why."""


class DecoderFamily(TransformersFamily):
    """A causal language model: no [CLS]/[SEP], a causal mask, next-token logits."""

    is_decoder: ClassVar[bool] = True
    auto_class: ClassVar[str] = "AutoModelForCausalLM"
    pair_rule: ClassVar[str] = "A, a line break, then B (a decoder has no [SEP])"
    word_rule: ClassVar[str] = "bpe"
    first_label: ClassVar[str] = "the first token"

    def encode(self, tokenizer: Any, text: str, text_b: str = "", *, max_tokens: int, truncate: bool = False,
               limit_hint: str = "") -> Any:
        return encode_decoder(tokenizer, text, text_b, max_tokens=max_tokens, truncate=truncate,
                              limit_hint=limit_hint)

    def final_norm(self, model: Any) -> Any:
        raise NotImplementedError

    def block_parts(self, model: Any, layer: int) -> dict[str, tuple[torch.nn.Module, str]]:
        """The modules of block ``layer`` that the decoder walk (``model_core.walk.decoder``) reads: name ->
        (module, "input" or "output").

        Raises:
            NoBlockWalk: this family has no block walk; the message says what to do.
        """
        raise NoBlockWalk(f"The block walk covers Llama-like decoders (RMSNorm, rotary embeddings, a gated MLP); a "
                         f"{self.label} is not one. Its attention is on every other page.")

    def unembed(self, model: Any, hidden: torch.Tensor, rows: Sequence[int] | None = None) -> torch.Tensor:
        """The next-token logits of ``hidden`` (the last layer's output): the final norm, the unembedding and any
        final softcap. ``rows``: only these tokens' logits, in this order (two rows of a 49,152-token unembedding
        instead of all of them: a patching metric, forward and backward).

        Shape: hidden (..., d_model) -> (..., vocab), or (..., len(rows)).
        """
        head = model.get_output_embeddings()
        normed = self.final_norm(model)(hidden)
        if rows is None or not isinstance(head, torch.nn.Linear):
            logits = head(normed)
            if rows is not None:
                logits = logits[..., list(rows)]
        else:
            index = torch.as_tensor(list(rows), dtype=torch.long, device=head.weight.device)
            logits = torch.nn.functional.linear(normed, head.weight[index],
                                                None if head.bias is None else head.bias[index])
        cap = getattr(model.config, "final_logit_softcapping", None)  # Gemma 2 caps its logits
        return logits if cap is None else torch.tanh(logits / cap) * cap
