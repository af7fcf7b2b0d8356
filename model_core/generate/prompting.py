"""What a generation starts from: the decoding options, the prompt's token ids (in the model's chat template or as
typed), the ids that end a reply, and the check that a prompt leaves room to generate."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from model_core.families.encoding import clean_text


@dataclass(frozen=True)
class DecodingOptions:
    """How to choose each new token.

    Attributes:
        max_new_tokens: the most new tokens (1 or more).
        sample: sample from the distribution (else greedy: the most likely token).
        temperature: divides the logits before sampling (> 0); sampling only.
        top_p: sample from the smallest set of tokens whose probability reaches this (0 < top_p <= 1); sampling only.
        seed: the sampling's random seed (a ``torch.Generator``), so a sampled reply can be repeated.
    """

    max_new_tokens: int = 48
    sample: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if int(self.max_new_tokens) != self.max_new_tokens or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a whole number of at least 1, got {self.max_new_tokens}.")
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature > 0):
            raise ValueError(f"temperature must be above 0 (1 samples the model's own distribution; lower is "
                             f"sharper), got {self.temperature}. For the most likely token, turn sampling off.")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] (1 keeps every token), got {self.top_p}.")
        if int(self.seed) != self.seed or self.seed < 0:
            raise ValueError(f"seed must be a whole number of 0 or more, got {self.seed}.")


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer has a chat template (an Instruct model's)."""
    return bool(getattr(tokenizer, "chat_template", None))


def prompt_ids(tokenizer: Any, prompt: str, chat: bool) -> list[int]:
    """The prompt's token ids: in the model's chat template as the user's message with the assistant's turn opened
    (``apply_chat_template(..., add_generation_prompt=True)``), or as typed with the tokenizer's own special tokens
    (a BOS where it adds one), as the app traces a text. The prompt is cleaned as every text is (``clean_text``).

    Raises:
        ValueError: the prompt is empty, or ``chat`` is asked of a tokenizer with no chat template.
    """
    text = clean_text(prompt)
    if not text:
        raise ValueError("The prompt is empty; type a question or the start of a text.")
    if not chat:
        return [int(i) for i in tokenizer(text, add_special_tokens=True)["input_ids"]]
    if not has_chat_template(tokenizer):
        raise ValueError("This model's tokenizer has no chat template (it is not an Instruct/chat model): turn the "
                         "chat template off to continue the prompt as typed.")
    templated = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                              tokenize=False)
    # As transformers tokenises a template: the template writes its own special tokens.
    return [int(i) for i in tokenizer(templated, add_special_tokens=False)["input_ids"]]


def eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """The ids that end a reply: the tokenizer's end-of-sequence token and the model's generation config's."""
    found: set[int] = set()
    for value in (getattr(tokenizer, "eos_token_id", None),
                  getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if value is None:
            continue
        found.update(int(v) for v in (value if isinstance(value, (list, tuple)) else [value]))
    return frozenset(found)


def check_room(n_prompt: int, max_new_tokens: int, limit: int, limit_hint: str = "") -> None:
    """Refuse a prompt that leaves no room to generate ``max_new_tokens`` within ``limit`` tokens.

    Raises:
        ValueError: with the numbers and what to change.
    """
    room = limit - n_prompt
    if room < 1:
        raise ValueError(f"The prompt has {n_prompt} tokens, and the limit is {limit}{limit_hint}: that leaves no room "
                         "to generate. Shorten the prompt.")
    if max_new_tokens > room:
        raise ValueError(f"The prompt has {n_prompt} tokens and the limit is {limit}{limit_hint}, so at most {room} "
                         f"new tokens fit; ask for {room} or fewer, or shorten the prompt.")
