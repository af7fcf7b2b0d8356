"""What every decoder language model shares: a causal mask, no [CLS]/[SEP], next-token logits and the logit lens.
GPT-2 and the Llama-like families say where their parts are (``gpt2.py``, ``llama.py``)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

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
        from model_core.trace.encoding import encode_decoder

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

    def unembed(self, model: Any, hidden: torch.Tensor) -> torch.Tensor:
        logits = model.get_output_embeddings()(self.final_norm(model)(hidden))
        cap = getattr(model.config, "final_logit_softcapping", None)  # Gemma 2 caps its logits
        return logits if cap is None else torch.tanh(logits / cap) * cap
